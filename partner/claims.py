"""Which due deliveries a claim takes: the one place the order and the fair share are decided.

Order. A subscription's next delivery is its oldest due one: by due time, then by enqueue order
(`seq`, one more than the highest of its open deliveries when queued; two enqueues committing
at the same moment on PostgreSQL may share one, and were not ordered anyway). A claim takes at most one
delivery per subscription, and a subscription with an attempt in flight under a live lease takes
none, so a subscription's deliveries go out one at a time in that order. A failed attempt is due
again later (its retry time): deliveries due before it go first.

Fair share: round robin, weighted by what each organization already holds. Each candidate is a
subscription's oldest due delivery. Within an organization the candidates are numbered 1, 2, ...
oldest head first (by due time, then event id); a candidate's turn is that number plus the
organization's attempts in flight now (in every process: the leases in the database). Free slots go
in turn order. So when several organizations have due deliveries, each gets one slot before any gets
a second, and one that already holds many slots waits until the others catch up; an organization
alone still takes every slot. Round robin rather than a fixed per-organization cap: a cap leaves
slots idle when few organizations are busy, and its size would depend on how many are; turns need no
such number. Subscriptions within an organization share the same way (one head each, oldest first).
Subscriptions whose last attempt failed take at most `failing_limit` of the slots, in turn order.

The candidates are found without reading the backlog or the history: a walk over the
delivery_queue index visits each subscription with open deliveries once (a loose index scan,
written as a recursive query because neither database does it on its own) and finds that
subscription's head in the same index; the attempts in flight come from their own index. A claim
costs the number of subscriptions with open work and of attempts in flight, not the number of due
deliveries, nor of finished ones: no step searches an index that history grows; each head and each
attempt in flight reads only its own row (bench/state_scale).
"""

from models import SQL_CONDITIONS
from partner.store.sql import select_rows

# Portable (SQLite 3.35+ and PostgreSQL 12+: recursive CTEs, window functions, MATERIALIZED), run
# by database.select_rows. The state conditions are the partial indexes' own, word for word. heads and
# busy are MATERIALIZED, so each is read once: inlined, heads' subqueries ran again at every use of a
# column, and a newer SQLite inlines busy at both of its uses.
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
heads AS MATERIALIZED (
    SELECT s.organization_id AS org, s.consecutive_failures > 0 AS failing,
           (SELECT due_at FROM delivery WHERE subscription_id = s.id AND {open} AND due_at <= {p}
            ORDER BY due_at, seq LIMIT 1) AS due_at,
           (SELECT event_id FROM delivery WHERE subscription_id = s.id AND {open} AND due_at <= {p}
            ORDER BY due_at, seq LIMIT 1) AS event_id
    FROM queued JOIN subscription AS s ON s.id = queued.id
    WHERE s.deleted_at IS NULL AND s.id NOT IN (SELECT subscription_id FROM busy)),
held AS (SELECT org, COUNT(*) AS slots FROM busy GROUP BY org),
turns AS (
    SELECT heads.*, COALESCE(held.slots, 0)
           + ROW_NUMBER() OVER (PARTITION BY heads.org ORDER BY due_at, event_id) AS turn
    FROM heads LEFT JOIN held ON held.org = heads.org WHERE heads.event_id IS NOT NULL),
ranked AS (
    SELECT turns.*, ROW_NUMBER() OVER (PARTITION BY failing ORDER BY turn, due_at, event_id) AS nth
    FROM turns)
SELECT event_id FROM ranked WHERE NOT failing OR nth <= {p}
ORDER BY turn, due_at, event_id LIMIT {p}
"""
_ANY_DUE = "SELECT 1 AS due FROM delivery WHERE {open} AND due_at <= {p} AND {live} LIMIT 1"
_NEXT_DUE = "SELECT MIN(due_at) AS due_at FROM delivery WHERE {open} AND due_at > {p}"


def pick_due(now_ms: int, limit: int, failing_limit: int | None) -> list[str]:
    """The event ids of up to `limit` deliveries to claim now, in turn order (module docstring)."""
    failing = limit if failing_limit is None else failing_limit
    rows = select_rows(_PICK, (now_ms, now_ms, now_ms, failing, limit), **SQL_CONDITIONS)
    return [row["event_id"] for row in rows]


def any_due(now_ms: int) -> bool:
    """Whether a delivery of a subscription not deleted is due. Asked after a claim that took
    nothing: then each waits behind an attempt in flight (one at a time per subscription), or
    another process's claim took it first."""
    return bool(select_rows(_ANY_DUE, (now_ms,), **SQL_CONDITIONS))


def next_due_at(now_ms: int) -> int | None:
    """When the next open delivery falls due after `now_ms` (a retry, a lease ending); None if none
    will. Deleted subscriptions' deliveries count too: a wake-up for one costs a scan that takes
    nothing, and leaving them out would search what the purge has yet to remove."""
    [row] = select_rows(_NEXT_DUE, (now_ms,), **SQL_CONDITIONS)
    return row["due_at"]
