"""Which due deliveries a claim takes: the one place the order and the fair share are decided.

Order. A subscription's deliveries are taken oldest due first: by due time, then by enqueue order
(`seq`, one more than the highest of its open deliveries when queued; two enqueues committing at
the same moment on PostgreSQL may share one, and were not ordered anyway: one goes per claim). A
subscription may have as many attempts in flight as its limit (partner/concurrency.py), in every
process: a claim offers it that many less those in flight under a live lease, its oldest due ones.
Pinned to one, its deliveries go out one at a time in that order; with more, they start in that
order and may end out of it. A failed attempt is due again later (its retry time): deliveries due
before it go first. A subscription held for a Retry-After offers none until the hold ends.

Fair share: round robin, weighted by what each organization already holds. Each candidate is one
of a subscription's due deliveries. Within an organization the candidates are numbered 1, 2, ...:
each subscription's first before any subscription's second (a subscription's place counts its own
attempts in flight too), then oldest first (by due time, then event id); a candidate's turn is that
number plus the organization's attempts in flight now (in every process: the leases in the
database). Free slots go in turn order. So when several organizations have due deliveries, each
gets one slot before any gets a second, and one that already holds many slots waits until the
others catch up; an organization alone still takes every slot. Round robin rather than a fixed
per-organization cap: a cap leaves slots idle when few organizations are busy, and its size would
depend on how many are; turns need no such number. Subscriptions within an organization share the
same way. Subscriptions whose last attempt failed take at most `failing_limit` of the slots, in turn
order.

The candidates are found without reading the backlog or the history: a walk over the
delivery_queue index visits each subscription with open deliveries once (a loose index scan,
written as a recursive query because neither database does it on its own), and a second walk takes
each one's due deliveries from the same index, one step per delivery that could be taken; the
attempts in flight come from their own index. A claim costs the number of subscriptions with open
work, of the deliveries it could take and of attempts in flight, not the number of due deliveries,
nor of finished ones: no step searches an index that history grows (bench/state_scale).
"""

from typing import NamedTuple

from models import SQL_CONDITIONS, allowance
from partner.store.sql import select_rows

# Portable (SQLite 3.35+ and PostgreSQL 12+: recursive CTEs, row values, window functions,
# MATERIALIZED), run by store.sql.select_rows. The state conditions are the partial indexes' own,
# word for word. busy, rooms, dues and levels are MATERIALIZED, so each is read once: inlined, a
# newer SQLite inlines busy at each of its uses, and the subqueries would run at each use of a
# column. From each subscription's head the walk goes on in claim order (due time, seq: the index's
# own, so each step reads one entry; two deliveries sharing both are offered one per claim), up to
# its room and its `depth`.
# What is left out changes nothing taken, nor its order (tests/test_fair_claims.py checks the whole
# rule against a model of it): a claim of `limit` slots never takes a candidate that `limit` steady
# ones of its organization come before (of subscriptions whose last attempt succeeded: the failing
# cap never removes those), nor any after it. `levels` counts the steady heads of each organization
# by attempts in flight: a head with `limit` of them at fewer in flight (`below`) is not read further,
# and those with as many or fewer (`beside`) all come before a subscription's second, as a steady
# subscription's own earlier ones come before its next. So a steady one's walk stops at `limit` less
# `beside`, a failing one's at its head once `beside` reaches `limit`. Without these bounds, a hundred
# subscriptions of one organization, each allowed several in flight, made every claim of 8 slots
# read a hundred heads and walk up to 8 deep from each.
_NEXT = ("(SELECT {column} FROM delivery WHERE subscription_id = c.subscription_id AND {open} AND due_at <= {p} "
         "AND (due_at, seq) > (c.due_at, c.seq) ORDER BY due_at, seq LIMIT 1)")
_FIRST = ("(SELECT {column} FROM delivery WHERE subscription_id = r.id AND {open} AND due_at <= {p} "
          "ORDER BY due_at, seq LIMIT 1)")
_PICK = """
WITH RECURSIVE queued (id) AS (
    SELECT * FROM (SELECT subscription_id FROM delivery WHERE {open}
                   ORDER BY subscription_id, due_at LIMIT 1) AS lowest
    UNION ALL
    SELECT (SELECT subscription_id FROM delivery WHERE {open} AND subscription_id > queued.id
            ORDER BY subscription_id, due_at LIMIT 1)
    FROM queued WHERE queued.id IS NOT NULL),
busy AS MATERIALIZED (
    SELECT d.subscription_id, s.organization_id AS org
    FROM delivery AS d JOIN subscription AS s ON s.id = d.subscription_id
    WHERE {in_flight} AND d.due_at > {p}),
held AS (SELECT org, COUNT(*) AS slots FROM busy GROUP BY org),
flying AS (SELECT subscription_id, COUNT(*) AS n FROM busy GROUP BY subscription_id),
rooms AS MATERIALIZED (
    SELECT s.id, s.organization_id AS org, s.consecutive_failures > 0 AS failing,
           COALESCE(flying.n, 0) AS flying, (""" + allowance("s") + """) - COALESCE(flying.n, 0) AS room
    FROM queued JOIN subscription AS s ON s.id = queued.id LEFT JOIN flying ON flying.subscription_id = s.id
    WHERE s.deleted_at IS NULL),
dues AS MATERIALIZED (
    SELECT r.id AS subscription_id, r.org, r.failing, r.flying, r.room,
           CASE WHEN r.failing THEN 0 ELSE 1 END AS steady, """ + _FIRST.replace("{column}", "due_at") + """ AS due_at
    FROM rooms AS r WHERE r.room > 0),
levels AS MATERIALIZED (
    SELECT org, flying, SUM(steady) AS steady FROM dues WHERE due_at IS NOT NULL GROUP BY org, flying),
reach AS (
    SELECT dues.*, (SELECT SUM(levels.steady) FROM levels WHERE levels.org = dues.org AND levels.flying <= dues.flying)
                   - dues.steady AS beside,
           (SELECT COALESCE(SUM(levels.steady), 0) FROM levels
            WHERE levels.org = dues.org AND levels.flying < dues.flying) AS below
    FROM dues WHERE due_at IS NOT NULL),
walks AS (
    SELECT reach.*, CASE WHEN failing THEN CASE WHEN beside >= {p} THEN 1 ELSE {p} END ELSE {p} - beside END AS depth
    FROM reach WHERE below < {p}),
candidates (subscription_id, org, failing, flying, room, depth, nth, due_at, seq, event_id) AS (
    SELECT subscription_id, org, failing, flying, room, depth, 1, due_at,
           CASE WHEN room > 1 AND depth > 1 THEN """ + _FIRST.replace("{column}", "seq").replace("r.id", "walks.subscription_id") + """ END,
           """ + _FIRST.replace("{column}", "event_id").replace("r.id", "walks.subscription_id") + """
    FROM walks
    UNION ALL
    SELECT c.subscription_id, c.org, c.failing, c.flying, c.room, c.depth, c.nth + 1, """ + ", ".join(
        _NEXT.replace("{column}", column) for column in ("due_at", "seq", "event_id")) + """
    FROM candidates AS c WHERE c.event_id IS NOT NULL AND c.nth < c.room AND c.nth < c.depth),
turns AS (
    SELECT candidates.*, COALESCE(held.slots, 0) + ROW_NUMBER() OVER (
               PARTITION BY candidates.org ORDER BY candidates.flying + candidates.nth, due_at, event_id) AS turn
    FROM candidates LEFT JOIN held ON held.org = candidates.org WHERE candidates.event_id IS NOT NULL),
ranked AS (
    SELECT turns.*, ROW_NUMBER() OVER (PARTITION BY failing ORDER BY turn, due_at, event_id) AS failing_nth
    FROM turns)
SELECT event_id, subscription_id, room FROM ranked WHERE NOT failing OR failing_nth <= {p}
ORDER BY turn, due_at, event_id LIMIT {p}
"""
# A due delivery of a subscription that is neither deleted nor held for a Retry-After.
_ANY_DUE = ("SELECT 1 AS due FROM delivery WHERE {open} AND due_at <= {p} AND EXISTS (SELECT 1 FROM subscription "
            "WHERE subscription.id = delivery.subscription_id AND subscription.deleted_at IS NULL "
            "AND (subscription.paused_until IS NULL OR subscription.paused_until <= {p})) LIMIT 1")
# The next delivery to fall due, or the next hold to end (its subscription's due deliveries with it).
_NEXT_DUE = ("SELECT MIN(at) AS due_at FROM (SELECT MIN(due_at) AS at FROM delivery WHERE {open} AND due_at > {p} "
             "UNION ALL SELECT MIN(paused_until) AS at FROM subscription WHERE paused_until > {p}) AS ends")


class Pick(NamedTuple):
    """A delivery chosen to claim, and how many its subscription could be given now (its room)."""
    event_id: str
    subscription_id: str
    room: int


def pick_due(now_ms: int, limit: int, failing_limit: int | None, most: int) -> list[Pick]:
    """Up to `limit` deliveries to claim now, in turn order (module docstring); `most`: the most
    attempts in flight to one subscription."""
    failing = limit if failing_limit is None else failing_limit
    params = (now_ms, now_ms, most, most, now_ms, limit, limit, limit, limit, now_ms, now_ms, *[now_ms] * 3, failing, limit)
    return [Pick(row["event_id"], row["subscription_id"], row["room"])
            for row in select_rows(_PICK, params, **SQL_CONDITIONS)]


def any_due(now_ms: int) -> bool:
    """Whether a delivery of a subscription not deleted nor held is due. Asked after a claim that took
    nothing: then each waits behind attempts in flight (its subscription at its limit), or another
    process's claim took it first."""
    return bool(select_rows(_ANY_DUE, (now_ms, now_ms), **SQL_CONDITIONS))


def next_due_at(now_ms: int) -> int | None:
    """When the next open delivery falls due after `now_ms` (a retry, a lease ending) or the next
    Retry-After hold ends; None if none will. Deleted subscriptions' deliveries count too: a wake-up
    for one costs a scan that takes nothing, and leaving them out would search what the purge has
    yet to remove."""
    [row] = select_rows(_NEXT_DUE, (now_ms, now_ms), **SQL_CONDITIONS)
    return row["due_at"]
