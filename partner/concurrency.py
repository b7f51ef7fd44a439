"""How many attempts may be in flight to one subscription at once, and how that limit follows what
its receiver shows: the rule, as pure functions of values, and its state in the subscription's row.

The rule is additive increase, multiplicative decrease (Chiu and Jain's rule, TCP's), on attempts in
flight rather than on a rate, with a memory of where the receiver last pushed back:

- A subscription starts at 1. While it is *held at its limit* (as many attempts in flight as the
  limit, in every process, and more deliveries due behind them), each success widens it:
  - until the receiver first pushes back, by one per success: the limit doubles every round trip
    (slow start), so a receiver answering in 200 ms reaches 16 in about a second;
  - after that, by one per round trip on average (each success of a round of `limit` attempts
    widens with chance 1 / limit) ...
  - ... except the step onto the limit at which the receiver last pushed back (its *ceiling*),
    taken once every PROBE_ROUNDS round trips on average.
- A timeout, a connection error, a 429 or a 5xx narrows it at once, each one, to 3/4 (and at least
  one less, never below 1); the limit it had becomes its ceiling.
- Anything else the receiver answers (another 4xx, a redirect, a TLS failure) says nothing about its
  capacity: the limit stays. So does a pinned one (`flask webhooks set-concurrency ID N`).

Why in flight rather than a rate: a receiver's capacity is usually a pool (worker processes,
threads, connections), and what it counts is requests under way; a limit in flight also follows
the receiver's latency by itself (rate = in flight ÷ latency), where a rate would need it known.

Why multiplicative decrease: it is the linear rule that backs off fast enough to stop an overload
(Chiu and Jain 1989), and a receiver that stops answering falls to 1 within a few attempts (16 in
flight timing out take it to 1). Why 3/4, not TCP Reno's 1/2 (CUBIC uses 0.7): the common push-back
here is a receiver at its worker limit refusing the one attempt beyond it, and halving from 5 to 2
would spend much of every cycle at half its capacity. Every failure narrows, not one per round
trip as in TCP: failures of a receiver at its worker limit come one at a time anyway.

Why the ceiling: every step above a receiver's worker limit costs one failed attempt, retried a
minute later by the schedule and counted toward the auto-disable streak. Stepping once per round
trip, a receiver of 4 workers would refuse one attempt in 7; CUBIC's answer is to linger below
where the last loss happened and probe past it rarely. Here the step onto the ceiling waits
PROBE_ROUNDS round trips on average: one refused attempt in about 33 for that receiver
(bench/concurrency.py: 22 of 722, 3 %, at 19.3 of its 20 deliveries a second). A receiver that
has grown since is found by that probe, and beyond the ceiling the pace is one step per round
again.

Why by chance rather than a counter: the expected pace is the same, and the subscription's row is
written only when the limit moves, never to count successes. Why only when held at the limit with
a backlog: a limit that was never used says nothing about the receiver (RFC 7661's rule for TCP):
a subscription delivering a trickle one at a time keeps a low limit, and does not send 16 at once,
untested, the day a backlog arrives.

Retry-After: a 429 or 503 carrying it is a failed attempt like any other, and also holds the
subscription's other due deliveries until then (at most MAX_HOLD_MS), without counting them as
attempts: `paused_until`, which a claim reads as a limit of 0. Attempts already in flight go on.

A failing endpoint is held, not hammered: from its second failed attempt in a row, the
subscription's next attempt waits a backoff that doubles with its consecutive failures, from
FIRST_BACKOFF_MS to MAX_BACKOFF_MS (the same hold as a Retry-After's, the longer of the two). At
fan-out volume a receiver down for a second would otherwise meet every attempt already queued for
it, reach SPEC's 20 consecutive failures within that second, be auto-disabled and have everything
pending dead-lettered. Held, it sees one attempt (a probe) per backoff: 20 failures in a row take
about 15 minutes of sustained failure. The attempts already in flight when it went down still
fail, each counted, which is why the first wait is short. One failure alone holds nothing: a
single 503 from a receiver at its worker limit is the limit's to answer (it narrows), and holding
on it cost a limited receiver a quarter of its pace (docs/performance.md); an outage fails several
attempts in a row, and the second starts the hold. Each delivery's own retry time is unchanged; a
hold only puts off when the next one starts.

Where it lives: the limit in the subscription's row; the attempts in flight are the live leases
(the delivery_in_flight index), so every process and host sees the same two numbers, and a claim
takes at most the limit less those in flight, in its one write transaction (queue.TAKE).
"""

import email.utils
import math
from collections.abc import Iterable
from dataclasses import dataclass

from partner import queue
from partner.store.sql import run_sql, select_rows
from partner.outbound.transport import AttemptResult

# The step onto the limit at which the receiver last pushed back waits this many round trips on average.
PROBE_ROUNDS = 8
# The longest hold a Retry-After gets: a receiver cannot park a subscription's deliveries for longer.
MAX_HOLD_MS = 60_000
# A failing subscription's next attempt waits this long after its second failure in a row, twice as
# long after each further one, at most MAX_BACKOFF_MS; after one failure alone, not at all.
FIRST_BACKOFF_MS = 1_000
MAX_BACKOFF_MS = 60_000
# Statuses whose Retry-After holds the subscription (RFC 9110: "too many requests", "unavailable").
HOLDING_STATUSES = (429, 503)
# A Retry-After longer than this is not a date or a number of seconds we read.
_MAX_RETRY_AFTER_LENGTH = 64


@dataclass(frozen=True)
class Limit:
    """A subscription's adaptive limit, and the limit at which its receiver last pushed back (None:
    never, so it still doubles)."""
    limit: int
    ceiling: int | None = None


def widened(current: Limit, draws: Iterable[float], most: int) -> Limit:
    """The limit after successes held at it with a backlog; one draw in [0, 1) per success (the
    chance of a step, when one is left to chance). Never above `most`."""
    limit = current.limit
    for draw in draws:
        if limit >= most:
            break
        if current.ceiling is None:  # slow start
            limit += 1
        elif draw * limit * (PROBE_ROUNDS if limit + 1 == current.ceiling else 1) < 1:
            limit += 1
    return Limit(min(limit, most), current.ceiling)


def narrowed(current: Limit) -> Limit:
    """The limit after a push-back: 3/4 of it and at least one less, never below 1; the limit it
    had becomes the ceiling."""
    limit = current.limit
    return Limit(max(1, min(limit - 1, math.ceil(limit * 3 / 4))), limit)


def narrows(result: AttemptResult) -> bool:
    """Whether a failed attempt shows the receiver overloaded or unreachable: a timeout, a connection
    error, a 429 or a 5xx."""
    if result.error in ("timeout", "connection_error"):
        return True
    status = result.http_status
    return result.error == "http_status" and status is not None and (status == 429 or 500 <= status <= 599)


def hold_until(result: AttemptResult, finished_at_ms: int) -> int | None:
    """Until when a 429 or 503's Retry-After (seconds, or an HTTP date) holds the subscription, at
    most MAX_HOLD_MS after the attempt ended; None when it asks for no hold, or says nothing we read.
    Not urllib3's Retry.parse_retry_after: it measures a date against time.time(), not the clock the
    attempt's end was read on (the CLOCK seam every hold and retry time runs on), and takes a date
    without a zone for GMT."""
    value = (result.retry_after or "").strip()
    if result.http_status not in HOLDING_STATUSES or not value or len(value) > _MAX_RETRY_AFTER_LENGTH:
        return None
    if value.isdigit():
        wait_ms = int(value) * 1000
    else:
        try:
            moment = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if moment.tzinfo is None:  # RFC 9110's dates are in GMT; a date without a zone is not one
            return None
        wait_ms = math.ceil(moment.timestamp() * 1000) - finished_at_ms
    if wait_ms <= 0:
        return None
    return finished_at_ms + min(wait_ms, MAX_HOLD_MS)


def backoff_until(consecutive_failures: int, finished_at_ms: int) -> int | None:
    """When a subscription whose attempt just failed, its `consecutive_failures`-th in a row, may be
    attempted again; None: at once (one failure alone)."""
    if consecutive_failures < 2:
        return None
    return finished_at_ms + min(MAX_BACKOFF_MS, FIRST_BACKOFF_MS << min(consecutive_failures - 2, 16))


def effective_limit(pin: int | None, limit: int, most: int) -> int:
    """The attempts a subscription may have in flight: its pin, else its adaptive limit, at most `most`."""
    return min(pin if pin is not None else limit, most)


# --- the state, read and written in the recording's transaction -----------------------------------

# The limit's state changes here and only here: widened after successes, narrowed and held after a failure.
_SET_LIMIT = 'UPDATE subscription SET concurrency_limit = :limit, concurrency_ceiling = :ceiling WHERE id = :id'
_SET_PUSHED_BACK = ('UPDATE subscription SET concurrency_limit = :limit, concurrency_ceiling = :ceiling, '
                    'paused_until = :paused_until WHERE id = :id')


def widen(draws_by_subscription: dict[str, list[float]], now_ms: int, most: int) -> None:
    """Widen each subscription held at its limit by its successes (`draws_by_subscription`: one draw
    per success). Call inside the recording's transaction, before its successes leave flight."""
    rows = select_rows(queue.HELD_AT_LIMIT, {"subscription_ids": sorted(draws_by_subscription), "most": most,
                                             "now_ms": now_ms})
    for row in rows:
        current = Limit(row["lim"], row["ceiling"])
        after = widened(current, draws_by_subscription[row["id"]], most)
        if after != current:
            run_sql(_SET_LIMIT, {"limit": after.limit, "ceiling": after.ceiling, "id": row["id"]})


def push_back(subscription_id: str, state: dict, result: AttemptResult, finished_at_ms: int) -> int | None:
    """After a failed attempt: narrow the subscription's limit (unless pinned) as `result` calls for, and
    hold it for its backoff, or the Retry-After if longer; until when it is held (None: not held). `state`: its row's
    failure streak (this failure counted) and concurrency columns as the recording read them. Call
    inside the recording's transaction."""
    current = Limit(state["concurrency_limit"], state["concurrency_ceiling"])
    after = narrowed(current) if narrows(result) and state["concurrency_pin"] is None else current
    held = max(backoff_until(state["consecutive_failures"], finished_at_ms) or 0,
               hold_until(result, finished_at_ms) or 0) or None
    paused_until = state["paused_until"]
    if held is not None and (paused_until is None or held > paused_until):
        paused_until = held
    if after != current or paused_until != state["paused_until"]:
        run_sql(_SET_PUSHED_BACK, {"limit": after.limit, "ceiling": after.ceiling, "paused_until": paused_until,
                                   "id": subscription_id})
    return paused_until
