"""Retention: delivered and dead-lettered events older than PARTNER_RETENTION_DAYS are deleted with
their deliveries and failure records. Pending and in-flight work is never touched. And deleted
subscriptions (tombstones: subscriptions.delete_subscription) are purged with their whole history.

Deletes go in small batches, each its own short write transaction (on SQLite the one write lock is
held for one batch only: bench/state_scale.py measures it), oldest first through event_created_at.
A daily scheduler job runs it in one process at a time, whatever the number of workers or hosts: a
lease row in `setting` says when the next run may start, and only one claimer moves it.
"""

import logging
import random
import time
from dataclasses import dataclass, fields
from datetime import datetime, timedelta, timezone

from models import Setting, db
from partner import idempotency
from partner.store.availability import is_unavailable
from partner.store.sql import is_sqlite, run_sql, write_transaction
from partner.timestamps import iso, now_ms

log = logging.getLogger(__name__)

DAY_MS = 86_400_000
BATCH = 100  # a few ms of SQLite write lock per batch (bench/state_scale.py: ≤ 50 ms)
PAUSE_SECONDS = 0.005  # between batches: writers queued behind one get in before the next
CHECK_EVERY_HOURS = 1  # each process checks hourly; the lease makes it one run a day overall
_LEASE = "retention_next_run_at"

# The state list is literal and complete: only finished deliveries can ever be selected. A delivery
# is (event, subscription): one event's deliveries to other subscriptions may still be open, and the
# event stays until its last delivery goes (_ORPHANS).
_FINISHED = ("SELECT d.event_id, d.subscription_id FROM event AS e JOIN delivery AS d ON d.event_id = e.id "
             "WHERE e.created_at < :before_ms AND d.state IN ('delivered', 'dead') "
             "ORDER BY e.created_at LIMIT :limit{lock}")
_DELETE = {"failures": "DELETE FROM failure WHERE event_id IN (:event_ids) "
                       "AND (event_id, subscription_id) IN (VALUES :deliveries)",
           "deliveries": "DELETE FROM delivery WHERE event_id IN (:event_ids) "
                         "AND (event_id, subscription_id) IN (VALUES :deliveries)"}
# Of these events, those no delivery names any more.
_ORPHANS = "DELETE FROM event WHERE id IN (:event_ids) AND NOT EXISTS (SELECT 1 FROM delivery WHERE delivery.event_id = event.id)"
_CLAIM = "UPDATE setting SET value = :next_run_at WHERE name = :lease AND CAST(value AS BIGINT) <= :now_ms"
# A deleted subscription's history, a batch at a time: deliveries first (they leave the due
# backlog), with the events they leave undelivered to anyone (_ORPHANS), then failures, then the row
# itself. Another subscription's delivery of the same event is never touched.
_DELETED = "SELECT id FROM subscription WHERE deleted_at IS NOT NULL LIMIT 1"
_PURGE_DELIVERIES = ("DELETE FROM delivery WHERE subscription_id = :subscription_id AND event_id IN "
                     "(SELECT event_id FROM delivery WHERE subscription_id = :subscription_id LIMIT :limit) "
                     "RETURNING event_id")
_PURGE_FAILURES = ("DELETE FROM failure WHERE id IN "
                   "(SELECT id FROM failure WHERE subscription_id = :subscription_id LIMIT :limit)")
_PURGE_ROW = "DELETE FROM subscription WHERE id = :subscription_id AND deleted_at IS NOT NULL"
PURGE_BATCH = 500  # rows of one table per write transaction: a few ms of SQLite's write lock
PURGE_EVERY_SECONDS = 10
PURGE_JOB = "purge-deleted"


@dataclass
class Pruned:
    events: int = 0
    deliveries: int = 0
    failures: int = 0

    def add(self, other: "Pruned") -> None:
        for field in fields(self):
            setattr(self, field.name, getattr(self, field.name) + getattr(other, field.name))


def cutoff(now: int, days: int) -> int:
    """The creation time (Unix ms) before which finished events go."""
    return now - days * DAY_MS


def prune(before_ms: int, batch: int = BATCH) -> Pruned:
    """Delete finished events created before `before_ms`, batch by batch, until none is left."""
    total = Pruned()
    while True:
        removed = prune_batch(before_ms, batch)
        total.add(removed)
        if removed.deliveries < batch:
            return total
        time.sleep(PAUSE_SECONDS)


def prune_batch(before_ms: int, limit: int) -> Pruned:
    """One batch in one write transaction: up to `limit` finished deliveries, their failure records,
    and their events once no delivery is left. On PostgreSQL the rows are locked as they are picked (a
    replay racing it waits or is skipped)."""
    lock = "" if is_sqlite() else " FOR UPDATE OF d SKIP LOCKED"
    with write_transaction(durable=False):
        deliveries = run_sql(_FINISHED, {"before_ms": before_ms, "limit": limit}, lock=lock).fetchall()
        if not deliveries:
            return Pruned()
        ids = [event_id for event_id, _ in deliveries]
        finished = {"event_ids": ids, "deliveries": [tuple(delivery) for delivery in deliveries]}
        counts = {name: run_sql(sql, finished).rowcount for name, sql in _DELETE.items()}
        counts["events"] = _delete_orphans(set(ids))
    return Pruned(**counts)


def _delete_orphans(event_ids: set[str]) -> int:
    """Delete those of the events that no delivery names any more; how many."""
    return run_sql(_ORPHANS, {"event_ids": list(event_ids)}).rowcount if event_ids else 0


def purge_deleted(batch: int = PURGE_BATCH) -> int:
    """Remove deleted subscriptions and their history, one short transaction per batch, until none
    is left; returns how many subscriptions went. Stopped midway (a crash), it finishes at the next
    run: the tombstone already hides everything left."""
    purged = 0
    while rows := run_sql(_DELETED, {}).fetchall():
        [subscription_id] = rows[0]
        while _purge_deliveries(subscription_id, batch) == batch:
            time.sleep(PAUSE_SECONDS)
        while _write(_PURGE_FAILURES, {"subscription_id": subscription_id, "limit": batch}) == batch:
            time.sleep(PAUSE_SECONDS)
        _write(_PURGE_ROW, {"subscription_id": subscription_id})
        purged += 1
    return purged


def _purge_deliveries(subscription_id: str, batch: int) -> int:
    """One batch of a deleted subscription's deliveries, and the events left undelivered to anyone."""
    with write_transaction(durable=False):
        batch_of = {"subscription_id": subscription_id, "limit": batch}
        purged = [event_id for (event_id,) in run_sql(_PURGE_DELIVERIES, batch_of)]
        _delete_orphans(set(purged))
    return len(purged)


def _write(statement: str, params: dict) -> int:
    """One statement in its own write transaction; how many rows it changed."""
    with write_transaction(durable=False):
        return run_sql(statement, params).rowcount


def run_purge() -> None:
    """The scheduler job: purge deleted subscriptions (in every process: batches are idempotent)."""
    purged = _unless_unavailable(purge_deleted)
    if purged:
        log.info("retention: purged %d deleted subscriptions and their history", purged)


def _unless_unavailable(job):
    """A retention job's result, or None while the database cannot answer or write: the job runs
    again at its next time, and the scanner already reports the outage."""
    try:
        with db.connection_context():
            return job()
    except Exception as error:  # noqa: BLE001 - unavailability waits, the rest re-raised
        if not is_unavailable(error):
            raise
        return None


def claim_daily_run(now: int) -> bool:
    """Whether this process may run today's prune: the first to ask after the lease expires wins,
    and moves the lease a day on, atomically."""
    with write_transaction(durable=False):
        Setting.insert(name=_LEASE, value="0").on_conflict_ignore().execute()
        return run_sql(_CLAIM, {"next_run_at": str(now + DAY_MS), "lease": _LEASE, "now_ms": now}).rowcount == 1


def run_daily(clock, days: int) -> Pruned | None:
    """The scheduler job: prune if no process has in the last day (None: another did, or the database
    is unavailable, and the job asks again in an hour); publishers' idempotency keys past 24 hours go too."""
    now = now_ms(clock)
    before = cutoff(now, days)
    pruned = _unless_unavailable(lambda: _daily(now, before))
    if pruned is not None:
        log.info("retention: removed %d events, %d deliveries, %d failure records created before %s",
                 pruned.events, pruned.deliveries, pruned.failures, iso(before))
    return pruned


def _daily(now: int, before: int) -> Pruned | None:
    if not claim_daily_run(now):
        return None
    idempotency.forget_old(now)
    return prune(before)


def schedule(scheduler, clock, days: int) -> None:
    """Add the retention jobs to the dispatcher's scheduler. The first daily check comes a few
    minutes after start-up (spread, so workers booting together do not all ask at once); deleted
    subscriptions are purged every PURGE_EVERY_SECONDS."""
    first = datetime.now(timezone.utc) + timedelta(seconds=random.uniform(60, 300))
    scheduler.add_job(run_daily, "interval", hours=CHECK_EVERY_HOURS, args=(clock, days),
                      id="retention", next_run_time=first, coalesce=True, max_instances=1)
    scheduler.add_job(run_purge, "interval", seconds=PURGE_EVERY_SECONDS, id=PURGE_JOB,
                      coalesce=True, max_instances=1)
