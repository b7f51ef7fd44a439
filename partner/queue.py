"""The delivery queue's rules, as the SQL every part of the engine runs: what is due, in what order,
how many attempts may be in flight to a subscription and to an organization, holds and leases. The
claim (partner/outbox.py), the adaptive limit (partner/concurrency.py), the backlog gauges and
readiness (partner/store/backlog.py) all run these statements, so each rule is stated once.
Parameters are bound by name (store.sql.bind): `:now_ms` is the current time, `:most` the most
attempts in flight to one subscription (DELIVERY_MAX_PER_SUBSCRIPTION).

Due. A delivery is open while pending or in flight. It is due when its due time has passed: a
pending one at its retry time, one in flight when its lease ends (its attempt died, and the next
claim counts it as unrecorded). A deleted subscription's deliveries are never due.

Held. A subscription is held until `paused_until`: a Retry-After, or a failing endpoint's backoff
(partner/concurrency.py). Held, it may have no attempt in flight beyond those under way (its
allowance is 0); its deliveries stay due, but are no work the service owes (`ready` excludes them).

Allowance. A subscription may have as many attempts in flight, in every process, as its pin, else
its adaptive limit, at most `:most`; 0 while held. A claim offers it that many less those in flight
under a live lease, its oldest due ones.

Order. A subscription's deliveries are taken oldest due first: by due time, then by enqueue order
(`seq`, one more than the highest of its open deliveries when queued; two enqueues committing at the
same moment on PostgreSQL may share one, and were not ordered anyway: one goes per claim). Pinned to
one, its deliveries go out one at a time in that order; with more, they start in that order and may
end out of it. A failed attempt is due again later (its retry time): deliveries due before it go
first.

Fair share: round robin, weighted by what each organization already holds. Each candidate is one of
a subscription's due deliveries. Within an organization the candidates are numbered 1, 2, ...: each
subscription's first before any subscription's second (a subscription's place counts its own
attempts in flight too), then oldest first (by due time, then event id); a candidate's turn is that
number plus the organization's attempts in flight now (in every process: the leases in the
database). Free slots go in turn order. So when several organizations have due deliveries, each gets
one slot before any gets a second, and one that already holds many waits until the others catch up.
Subscriptions within an organization share the same way. Subscriptions whose last attempt failed take
at most `:failing_limit` of the slots, in turn order.

Share of the slots. Turns share the free slots, but slots already held are not taken back: an
organization alone may fill every slot with attempts that take seconds (a slow receiver), and another
organization's next delivery would wait for one of them to end. So a process has `:spare` slots, which
go in turn order to anyone, and beyond them, up to `:limit`, slots that go only to an organization
holding less than its share: the process's `:slots` divided among the organizations holding or waiting
for one (rounded up, so the shares together may pass the slots by one less than the organizations;
`:limit`, the threads free, still bounds what is taken). Alone, an organization may use every slot;
while another waits, one that holds more than its share is given only spare slots, after the other's
turns, and the other is given slots beyond the spare ones up to its share, at once. The attempts in
flight are counted in every process, so on several processes the share is of one process's slots,
counted across all: stricter, never looser, which also means a newcomer's room beyond the spare
slots is one share for the whole fleet, not one per process; the protection narrows as the service
scales out (each process's spare slots still go in turn order).

The candidates are found without reading the backlog or the history: a walk over the delivery_queue
index visits each subscription with open deliveries once (a loose index scan, written as a recursive
query because neither database does it on its own), and a second walk takes each one's due
deliveries from the same index, one step per delivery that could be taken; the attempts in flight
come from their own index. A claim costs the number of subscriptions with open work, of the
deliveries it could take and of attempts in flight, not the number of due deliveries, nor of
finished ones: no step searches an index that history grows (bench/state_scale).
"""

# Literal, not bound parameters: SQLite uses a partial index only for a query that repeats its WHERE
# clause word for word, so the statements and the indexes (models.py) share these fragments.
OPEN = "\"state\" IN ('pending', 'in_flight')"
IN_FLIGHT = "\"state\" = 'in_flight'"
# A delivery whose subscription is not deleted (a deleted one's history waits for the purge).
LIVE_SUBSCRIPTION = ("SELECT 1 FROM subscription WHERE subscription.id = delivery.subscription_id "
                     "AND subscription.deleted_at IS NULL")
LIVE = f"EXISTS ({LIVE_SUBSCRIPTION})"


def held(alias: str) -> str:
    """SQL: whether the subscription row `alias` is held (a Retry-After or a backoff) at :now_ms."""
    return f"{alias}.paused_until > :now_ms"


def allowance(alias: str) -> str:
    """SQL: how many attempts the subscription row `alias` may have in flight at :now_ms."""
    limit = f"COALESCE({alias}.concurrency_pin, {alias}.concurrency_limit)"
    return f"CASE WHEN {held(alias)} THEN 0 WHEN {limit} > :most THEN :most ELSE {limit} END"


# The attempts in flight under a live lease (an expired one is due instead), by subscription.
_FLYING = f"SELECT subscription_id, COUNT(*) AS n FROM delivery WHERE {IN_FLIGHT} AND due_at > :now_ms GROUP BY subscription_id"

# --- the claim: which due deliveries to take (PICK), then taking them (TAKE) -------------------------

# Portable (SQLite 3.35+ and PostgreSQL 12+: recursive CTEs, row values, window functions,
# MATERIALIZED). busy, rooms, dues and levels are MATERIALIZED, so each is read once: inlined, a newer
# SQLite inlines busy at each of its uses, and the subqueries would run at each use of a column. From
# each subscription's head the walk goes on in claim order (due time, seq: the index's own, so each
# step reads one entry; two deliveries sharing both are offered one per claim), up to its room and its
# `depth`.
# What is left out changes nothing taken, nor its order (tests/test_fair_claims.py checks the whole rule
# against a model of it): a claim of `:limit` slots never takes a candidate that `:limit` steady ones of
# its organization come before (of subscriptions whose last attempt succeeded: the failing cap never
# removes those), nor any after it. `levels` counts the steady heads of each organization by attempts
# in flight: a head with `:limit` of them at fewer in flight (`below`) is not read further, and those
# with as many or fewer (`beside`) all come before a subscription's second, as a steady subscription's
# own earlier ones come before its next. So a steady one's walk stops at `:limit` less `beside`, a
# failing one's at its head once `beside` reaches `:limit`. Without these bounds, a hundred
# subscriptions of one organization, each allowed several in flight, made every claim of 8 slots read
# a hundred heads and walk up to 8 deep from each.
_NEXT = (f"(SELECT {{column}} FROM delivery WHERE subscription_id = c.subscription_id AND {OPEN} "
         f"AND due_at <= :now_ms AND (due_at, seq) > (c.due_at, c.seq) ORDER BY due_at, seq LIMIT 1)")
_FIRST = (f"(SELECT {{column}} FROM delivery WHERE subscription_id = {{head}} AND {OPEN} AND due_at <= :now_ms "
          f"ORDER BY due_at, seq LIMIT 1)")
PICK = f"""
WITH RECURSIVE queued (id) AS (
    SELECT * FROM (SELECT subscription_id FROM delivery WHERE {OPEN}
                   ORDER BY subscription_id, due_at LIMIT 1) AS lowest
    UNION ALL
    SELECT (SELECT subscription_id FROM delivery WHERE {OPEN} AND subscription_id > queued.id
            ORDER BY subscription_id, due_at LIMIT 1)
    FROM queued WHERE queued.id IS NOT NULL),
busy AS MATERIALIZED (
    SELECT d.subscription_id, s.organization_id AS org
    FROM delivery AS d JOIN subscription AS s ON s.id = d.subscription_id
    WHERE {IN_FLIGHT} AND d.due_at > :now_ms),
holding AS (SELECT org, COUNT(*) AS slots FROM busy GROUP BY org),
flying AS (SELECT subscription_id, COUNT(*) AS n FROM busy GROUP BY subscription_id),
rooms AS MATERIALIZED (
    SELECT s.id, s.organization_id AS org, s.consecutive_failures > 0 AS failing,
           COALESCE(flying.n, 0) AS flying, ({allowance("s")}) - COALESCE(flying.n, 0) AS room
    FROM queued JOIN subscription AS s ON s.id = queued.id LEFT JOIN flying ON flying.subscription_id = s.id
    WHERE s.deleted_at IS NULL),
dues AS MATERIALIZED (
    SELECT r.id AS subscription_id, r.org, r.failing, r.flying, r.room,
           CASE WHEN r.failing THEN 0 ELSE 1 END AS steady, {_FIRST.format(column="due_at", head="r.id")} AS due_at
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
    SELECT reach.*, CASE WHEN failing THEN CASE WHEN beside >= :limit THEN 1 ELSE :limit END ELSE :limit - beside END
                    AS depth
    FROM reach WHERE below < :limit),
candidates (subscription_id, org, failing, flying, room, depth, nth, due_at, seq, event_id) AS (
    SELECT subscription_id, org, failing, flying, room, depth, 1, due_at,
           CASE WHEN room > 1 AND depth > 1 THEN {_FIRST.format(column="seq", head="walks.subscription_id")} END,
           {_FIRST.format(column="event_id", head="walks.subscription_id")}
    FROM walks
    UNION ALL
    SELECT c.subscription_id, c.org, c.failing, c.flying, c.room, c.depth, c.nth + 1,
           {", ".join(_NEXT.format(column=column) for column in ("due_at", "seq", "event_id"))}
    FROM candidates AS c WHERE c.event_id IS NOT NULL AND c.nth < c.room AND c.nth < c.depth),
turns AS (
    SELECT candidates.*, COALESCE(holding.slots, 0) + ROW_NUMBER() OVER (
               PARTITION BY candidates.org ORDER BY candidates.flying + candidates.nth, due_at, event_id) AS turn
    FROM candidates LEFT JOIN holding ON holding.org = candidates.org WHERE candidates.event_id IS NOT NULL),
shares AS (
    SELECT (:slots + COUNT(*) - 1) / NULLIF(COUNT(*), 0) AS share
    FROM (SELECT org FROM holding UNION SELECT org FROM turns) AS busy_orgs),
ranked AS (
    SELECT turns.*, ROW_NUMBER() OVER (PARTITION BY failing ORDER BY turn, due_at, event_id) AS failing_nth
    FROM turns),
admitted AS (
    SELECT ranked.*, ROW_NUMBER() OVER (ORDER BY turn, due_at, event_id) AS nth_taken
    FROM ranked WHERE NOT failing OR failing_nth <= :failing_limit)
SELECT event_id, subscription_id, room, nth_taken > :spare AS beyond
FROM admitted, shares WHERE nth_taken <= :spare OR turn <= share
ORDER BY turn, due_at, event_id LIMIT :limit
"""
# A due delivery of a subscription that is neither deleted nor held.
ANY_DUE = (f"SELECT 1 AS due FROM delivery WHERE {OPEN} AND due_at <= :now_ms AND EXISTS (SELECT 1 FROM subscription "
           f"WHERE subscription.id = delivery.subscription_id AND subscription.deleted_at IS NULL "
           f"AND NOT COALESCE({held('subscription')}, FALSE)) LIMIT 1")
# The next delivery to fall due, or the next hold to end (its subscription's due deliveries with it).
NEXT_DUE = (f"SELECT MIN(at) AS due_at FROM (SELECT MIN(due_at) AS at FROM delivery WHERE {OPEN} AND due_at > :now_ms "
            f"UNION ALL SELECT MIN(paused_until) AS at FROM subscription WHERE paused_until > :now_ms) AS ends")

# Takes the picked deliveries (:picked, pairs of event and subscription id; :event_ids, their event
# ids: `event_id IN` first, as SQLite plans a row-value IN (VALUES ...) alone as a scan of the whole
# table) that are still due and whose subscription is not deleted: another process may have taken one
# or deleted its subscription since the pick, and on PostgreSQL SKIP LOCKED passes over one it is
# taking. A delivery in flight whose lease expired is an attempt whose outcome was never recorded: it
# is counted here. Of each subscription's, no more than its allowance less its attempts in flight under
# a live lease, oldest first: counted in this statement, inside the claim's write transaction, so no
# other claim can take the same room meanwhile (on SQLite, the one writer; on PostgreSQL, claims of one
# subscription take turns: TAKE_TURN). {live} and {lock} are the database's own (outbox.claim_due).
TAKE = (f"UPDATE delivery SET state = 'in_flight', due_at = :lease_ends, lease_token = :token, "
        f"unrecorded = unrecorded + CASE WHEN {IN_FLIGHT} THEN 1 ELSE 0 END WHERE event_id IN (:event_ids) "
        f"AND (event_id, subscription_id) IN "
        f"(SELECT event_id, subscription_id FROM (SELECT event_id, subscription_id, ROW_NUMBER() OVER "
        f"(PARTITION BY subscription_id ORDER BY due_at, seq, event_id) AS nth FROM "
        f"(SELECT event_id, subscription_id, due_at, seq FROM delivery WHERE event_id IN (:event_ids) "
        f"AND (event_id, subscription_id) IN (VALUES :picked) AND {OPEN} "
        f"AND due_at <= :now_ms AND {{live}}{{lock}}) AS takeable) AS ranked WHERE nth <= "
        f"(SELECT {allowance('s')} FROM subscription AS s WHERE s.id = ranked.subscription_id) - "
        f"(SELECT COUNT(*) FROM delivery AS f WHERE f.subscription_id = ranked.subscription_id "
        f"AND {IN_FLIGHT} AND f.due_at > :now_ms))")
# PostgreSQL: a claim's statement cannot see another's uncommitted take, so claims of one subscription
# take turns on a transaction-scoped advisory lock, each counting the attempts in flight after the last
# has committed; one held by another claim is passed over, as SKIP LOCKED passes over rows. In a key
# space of its own (two keys), apart from the migrations' lock (one key).
TAKE_TURN = "SELECT v.id FROM (VALUES :subscription_ids) AS v (id) WHERE pg_try_advisory_xact_lock(:lock_class, hashtext(v.id))"
CLAIM_LOCK_CLASS = 0x70617274  # any constant
# PostgreSQL's {live}: holds the subscription until the claim commits, or passes over one another
# transaction writes (a delete under way): the take's half of outbox.py's rule on deletes.
LIVE_HELD = f"EXISTS ({LIVE_SUBSCRIPTION} FOR SHARE SKIP LOCKED)"
# What the attempts of the deliveries taken under :token need.
CLAIMED = ("SELECT e.id AS event_id, e.kind, e.body, e.occurred_at, e.data, e.created_at, d.attempts, d.unrecorded, "
           "s.id AS subscription_id, s.organization_id, s.url, s.secret_key_id, s.secret_sealed, "
           "s.consecutive_failures, s.active, s.concurrency_pin IS NULL AND s.concurrency_limit < :most AS may_widen "
           "FROM delivery AS d JOIN event AS e ON e.id = d.event_id "
           "JOIN subscription AS s ON s.id = d.subscription_id WHERE d.event_id IN (:event_ids) AND d.lease_token = :token")

# --- leases given back ----------------------------------------------------------------------------

# A claimed delivery given back (pending, due again) or dead-lettered (dead, no due time, why it ended).
RELEASE = (f"UPDATE delivery SET state = :state, due_at = :due_at, lease_token = NULL, ended = :ended "
           f"WHERE lease_token = :token AND event_id = :event_id AND subscription_id = :subscription_id AND {IN_FLIGHT}")
# A delivery given back unattempted, due later: its subscription's pending deliveries wait with it, so
# that none overtakes it, and, when this process cannot open the subscription's secret, so that each
# scan does not take (and log) the next.
POSTPONE = ("UPDATE delivery SET due_at = :due_at WHERE subscription_id = :subscription_id AND state = 'pending' "
            "AND due_at < :due_at")

# --- the adaptive limit: who may widen ----------------------------------------------------------------

# The subscriptions among :subscription_ids that can widen: adaptive, below the most, held at their
# limit (attempts in flight under a live lease, this batch's among them, not fewer than the limit) with
# a delivery due behind them. The counts walk the delivery_in_flight and delivery_queue indexes.
HELD_AT_LIMIT = (f"SELECT s.id, s.concurrency_limit AS lim, s.concurrency_ceiling AS ceiling FROM subscription AS s "
                 f"WHERE s.id IN (:subscription_ids) AND s.concurrency_pin IS NULL AND s.concurrency_limit < :most "
                 f"AND (SELECT COUNT(*) FROM delivery WHERE subscription_id = s.id AND {IN_FLIGHT} "
                 f"AND due_at > :now_ms) >= s.concurrency_limit "
                 f"AND EXISTS (SELECT 1 FROM delivery WHERE subscription_id = s.id AND {OPEN} AND due_at <= :now_ms)")

# --- the backlog, as readiness and the metrics report it ------------------------------------------

# Due deliveries, and of them those `ready`: of subscriptions not held, work the service owes now, where
# a held one is work the receiver asked to wait (a partner's 429s or outage would look like the service
# lagging). The WHERE clause is the delivery_due_at partial index's own, so the count walks that index
# (open deliveries only), however many finished rows the table holds.
DUE = (f"SELECT COUNT(*) AS due, MIN(due_at) AS oldest, COUNT(ready) AS ready, MIN(ready) AS oldest_ready FROM "
       f"(SELECT due_at, CASE WHEN EXISTS (SELECT 1 FROM subscription WHERE subscription.id = delivery.subscription_id "
       f"AND {held('subscription')}) THEN NULL ELSE due_at END AS ready FROM delivery WHERE {OPEN} "
       f"AND due_at <= :now_ms AND {LIVE}) AS due")
# Subscriptions held at their allowance with deliveries due behind them; from the attempts in flight
# (their partial index): few, whatever the history or the backlog.
AT_LIMIT = (f"SELECT COUNT(*) AS at_limit FROM ({_FLYING}) AS f JOIN subscription AS s ON s.id = f.subscription_id "
            f"WHERE s.deleted_at IS NULL AND f.n >= ({allowance('s')}) AND NOT COALESCE({held('s')}, FALSE) "
            f"AND EXISTS (SELECT 1 FROM delivery WHERE subscription_id = s.id AND {OPEN} AND due_at <= :now_ms)")
HELD = f"SELECT COUNT(*) AS held FROM subscription AS s WHERE {held('s')} AND s.deleted_at IS NULL"
