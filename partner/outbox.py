"""The durable delivery queue's engine: claim due deliveries, and give back those not attempted.
Each attempt's outcome is recorded by partner/outcomes.py; events come in through partner/events.py.

Every function takes the current time as an argument. A claim is one short write transaction that
takes deliveries under a lease and reads what their attempts need; HTTP happens outside any
transaction; recording an outcome is a second short write that only counts if the lease is still ours.
It locks the delivery before its subscription: whatever else takes both does the same
(subscriptions.delete_subscription), or PostgreSQL can find the two waiting for each other.

A delete and the attempt under way (docs/decisions.md): after the delete's 204 nothing more is
started, and the outcome of an attempt claimed before it commits is not recorded. On SQLite writes
take turns, so a claim commits wholly before a delete (which drops the lease it finds in flight) or
after it (and finds the subscription deleted). On PostgreSQL they overlap: the take checks the
subscription in its statement's snapshot, and the delete writes no pending delivery, so no row lock
of the take would meet it. So the take holds the subscription of each delivery it takes (FOR SHARE,
which the delete's UPDATE of it waits for), and recording holds each delivery and then its
subscription, and records nothing for a deleted one (outcomes._HOLD). Each order of the two then
ends right:
- the delete commits before the take locks the subscription: PostgreSQL checks a row it locks again
  in its newest version, so the take finds it deleted and takes nothing;
- the delete holds the subscription, uncommitted: the take passes over it (SKIP LOCKED);
- the take holds it first: the delete waits for the claim's commit, so the attempt was under way
  before the 204; its outcome, written after, finds the subscription deleted, though
  subscriptions._DROP_LEASES ran before the take committed and could not see it;
- recording holds it first: the outcome commits before the delete does, which then finds no attempt.
Deadlocks: the take waits for nothing (SKIP LOCKED, and only a try at each subscription's turn:
queue.TAKE_TURN); recording and the delete take the delivery before the subscription, and a recording
of several subscriptions takes them in id order (outcomes._HOLD); `flask encryption rotate` passes
over held rows. Three rare cycles remain, and PostgreSQL ends each by rolling one side back, which
is made again (the scan, the request, or the operator's command, which says so): a claim settling a
delivery it will not attempt (_attemptable) writes as recording does while it holds the
subscription; an auto-disable, part of a recording that holds the subscription, sweeps its other
open deliveries, one of which another process's recording may hold while it waits for the
subscription; and a replay takes the subscription first, then dead letters, one of which may be an
attempt still under way when an auto-disable dead-lettered it (it keeps its lease), held by its
recording.
"""

import logging
import secrets
from collections import Counter

from models import Delivery
from partner import dead_letters, queue
from partner.claims import MAX_UNRECORDED, Claim, NEVER_RECORDED, Pick, pick_due
from partner.config import DEFAULTS
from partner.envelopes import envelope
from partner.outcomes import record_failure
from partner.retry import RetryPolicy
from partner.sealing import SealingError, open_secret
from partner.store.sql import is_sqlite, run_sql, select_rows, write_transaction

log = logging.getLogger(__name__)

# Every attempt runs the queue's statements (partner/queue.py), written once as SQL rather than built
# by the ORM each time: peewee spent more of the dispatcher's CPU compiling them than SQLite spent
# running them (bench/delivery_throughput).
_SQLITE_TAKE = {"live": queue.LIVE, "lock": ""}
_POSTGRES_TAKE = {"live": queue.LIVE_HELD, "lock": " FOR UPDATE SKIP LOCKED"}


def claim_due(now_ms: int, limit: int, lease_ms: int, failing_limit: int | None = None,
              auto_disable_threshold: int = DEFAULTS["AUTO_DISABLE_THRESHOLD"],
              most: int = DEFAULTS["DELIVERY_MAX_PER_SUBSCRIPTION"], slots: int | None = None,
              spare: int | None = None) -> list[Claim]:
    """Claim up to `limit` due deliveries (pending and due, or in flight with an expired lease)
    for `lease_ms`, chosen by claims.pick_due: each subscription's oldest, no more than its limit
    (at most `most`) less its attempts in flight, slots shared among organizations (`slots`, `spare`:
    claims.pick_due), at most
    `failing_limit` (None: any number) to subscriptions whose last attempt failed. A due delivery is
    claimed by exactly one caller, in any process, and a subscription's limit holds across them all.
    Rows not taken are not written.

    The choice is read first; then one write transaction takes the chosen deliveries that are still
    open, due, of a subscription not deleted and within its limit (what another process may have
    changed meanwhile), reads what their attempts need, and settles those not to attempt
    (_attemptable). A failure anywhere rolls it all back: nothing is taken that no attempt was made
    for, so nothing is counted as unrecorded that was never sent."""
    if limit <= 0:
        return []
    picked = pick_due(now_ms, limit, failing_limit, most, slots, spare)
    if not picked:
        return []
    token = secrets.token_hex(11)  # 22 characters; a tenth of random_token's cost, once per scan
    made: list = []  # dead letters, reported once committed
    with write_transaction(durable=False):
        ours = picked if is_sqlite() else _our_turn(picked)
        if not ours:
            return []
        event_ids = [pick.event_id for pick in ours]
        taken = run_sql(queue.TAKE, {"lease_ends": now_ms + lease_ms, "token": token, "event_ids": event_ids,
                                     "picked": [(pick.event_id, pick.subscription_id) for pick in ours],
                                     "now_ms": now_ms, "most": most},
                        **(_SQLITE_TAKE if is_sqlite() else _POSTGRES_TAKE)).rowcount
        if not taken:
            return []
        rows = {(row["event_id"], row["subscription_id"]): row
                for row in select_rows(queue.CLAIMED, {"most": most, "event_ids": event_ids, "token": token})}
        _filled(ours, rows)
        taken = [rows[key] | {"beyond": pick.beyond}
                 for pick in ours if (key := (pick.event_id, pick.subscription_id)) in rows]
        claims = _attemptable(taken, token, now_ms, lease_ms, RetryPolicy([], auto_disable_threshold), made)
    dead_letters.report(made)
    return claims


def _filled(picked: list[Pick], rows: dict[tuple[str, str], dict]) -> None:
    """Whether each claim may widen its subscription's limit when it succeeds: only if this claim
    filled the subscription's room, so it is held at its limit. One the fair share or the free
    slots kept below it is not, and its outcome need not look (concurrency.widen)."""
    taken = Counter(row["subscription_id"] for row in rows.values())
    room = {pick.subscription_id: pick.room for pick in picked}
    for row in rows.values():
        row["may_widen"] = row["may_widen"] and taken[row["subscription_id"]] >= room[row["subscription_id"]]


def _our_turn(picked: list[Pick]) -> list[Pick]:
    """PostgreSQL: the picked deliveries of the subscriptions whose turn this claim took (queue.TAKE_TURN),
    until its transaction ends."""
    subscriptions = sorted({pick.subscription_id for pick in picked})
    ours = {row["id"] for row in select_rows(queue.TAKE_TURN, {"subscription_ids": [(id,) for id in subscriptions],
                                                               "lock_class": queue.CLAIM_LOCK_CLASS})}
    return [pick for pick in picked if pick.subscription_id in ours]


def _attemptable(rows: list[dict], token: str, now_ms: int, lease_ms: int, policy: RetryPolicy,
                 made: list) -> list[Claim]:
    """The claims to attempt among the rows taken under `token`. The others are settled in the
    claim's transaction: of a subscription disabled while they were queued, dead-lettered as disabling
    does; with a secret this process cannot open (sealed under a key it lacks: another process's
    configuration), given back uncounted and logged, its subscription's pending deliveries due no
    sooner than the lease would have ended; unrecorded MAX_UNRECORDED times, dead-lettered as a
    failure (`not_recorded`). What is dead-lettered is added to `made`."""
    claims = []
    for row in rows:
        if not row["active"]:
            _release(token, row["event_id"], row["subscription_id"], Delivery.DEAD, None,
                     dead_letters.ending("subscription_disabled"))
            made += dead_letters.of_disabled(row["subscription_id"], [row])
            continue
        try:
            claim = _claim_of(row, token)
        except SealingError as error:
            log.error("delivery of %s to %s not attempted: %s", row["event_id"], row["subscription_id"], error)
            _put_off(token, row["event_id"], row["subscription_id"], now_ms + lease_ms)
            continue
        if row["unrecorded"] >= MAX_UNRECORDED:
            record_failure(claim, NEVER_RECORDED, now_ms, now_ms, policy, 0.0, made)
        else:
            claims.append(claim)
    return claims


def _claim_of(row: dict, token: str) -> Claim:
    """A claim from its delivery, event and subscription row. The attempt number is written only
    when an outcome is recorded: an attempt cut short is made again under the same number."""
    body = (bytes(row["body"]) if row["body"] is not None else
            envelope(row["kind"], row["event_id"], row["subscription_id"], row["occurred_at"], bytes(row["data"])))
    return Claim(row["event_id"], row["kind"], body, row["attempts"] + 1, token,
                 row["subscription_id"], row["organization_id"], row["url"],
                 open_secret(row["subscription_id"], row["secret_key_id"], row["secret_sealed"]),
                 row["consecutive_failures"] > 0, bool(row["may_widen"]), row["created_at"], row["beyond"])


def put_off(claim: Claim, due_ms: int) -> bool:
    """Give back a claim whose attempt could not start (no DNS lookup of its host could: partner/courier.py):
    pending, due at `due_ms`, the attempt not counted, its subscription's pending deliveries due no
    sooner. Whether the lease was still ours."""
    with write_transaction(durable=False):
        return _put_off(claim.lease_token, claim.event_id, claim.subscription_id, due_ms)


def _put_off(lease_token: str, event_id: str, subscription_id: str, due_ms: int) -> bool:
    released = _release(lease_token, event_id, subscription_id, Delivery.PENDING, due_ms)
    if released:
        run_sql(queue.POSTPONE, {"due_at": due_ms, "subscription_id": subscription_id})
    return bool(released)


def _release(lease_token: str, event_id: str, subscription_id: str, state: str, due_at: int | None,
             why: str | None = None) -> int:
    """Give back a claimed delivery (pending, due again) or dead-letter it (dead, no due time, `why`)."""
    return run_sql(queue.RELEASE, {"state": state, "due_at": due_at, "ended": why, "token": lease_token,
                                   "event_id": event_id, "subscription_id": subscription_id}).rowcount
