"""The delivery dispatcher: scans for due deliveries and runs their attempts (partner/courier.py) on a bounded pool.

One APScheduler job polls every DELIVERY_POLL_INTERVAL seconds; `wake()` runs it at once when an
event is queued, and every finished attempt refills its slot straight away. Nothing here starts
on import or in create_app: gunicorn's post_worker_init hook calls `start()`.

Dead endpoints must not starve healthy ones. An attempt to an endpoint that hangs holds its slot
until the deadline, and before its first timeout nothing tells it from a slow healthy one. So the
pool is large (DELIVERY_CONCURRENCY slots, default 256, and as many threads again for organizations
below their share: partner/queue.py; a thread waiting on a socket costs little), a
subscription's attempts in flight are held to its limit (partner/concurrency.py: 1 until its
receiver answers, and narrowed by every timeout), and subscriptions whose last attempt failed may
hold at most half of the slots together: however many endpoints are dead, once they have failed
once they leave the other half to the healthy ones.
"""

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from partner import retention
from partner.claims import Claim, any_due, next_due_at
from partner.courier import Courier
from partner.jobs import SCAN_JOB, Jobs
from partner.outbox import claim_due, put_off
from partner.store.availability import database_failed, database_outage, describe, is_unavailable
from partner.store.connection import db
from partner.store.sql import probe_write
from partner.timestamps import now_ms

log = logging.getLogger(__name__)

# A finished attempt refills slots once this many are free (or half of them, if fewer): one claim
# then starts several attempts, instead of one claim per attempt under load.
REFILL_BATCH = 8
# A scan that took nothing and left nothing in flight here, while deliveries are due, scans again
# after this long (seconds), doubling up to the poll interval, not at the next poll: they may wait
# behind other processes' attempts, or another process's claim took the rows this one picked, and
# no attempt finishing here will scan. Another process refills its slots the moment an attempt
# finishes, so without this a backlog stays with whichever process holds it (bench/scale_out). A
# scan that finds nothing writes nothing.
RESCAN_SECONDS = 0.02
# While the database fails, scans wait this long, doubling up to the maximum (seconds).
SCAN_BACKOFF_SECONDS, MAX_SCAN_BACKOFF_SECONDS = 1, 60


class Dispatcher:
    """Claims due deliveries into free slots of a thread pool, where its courier attempts each."""

    def __init__(self, config):
        self.clock = config["CLOCK"]
        self.auto_disable_threshold = config["AUTO_DISABLE_THRESHOLD"]
        self.concurrency = config["DELIVERY_CONCURRENCY"]
        self.most_per_subscription = config["DELIVERY_MAX_PER_SUBSCRIPTION"]
        self.enabled = config["SCHEDULER_ENABLED"]
        # The pool's threads: the slots, and as many again that only an organization below its share of
        # the slots may take (partner/queue.py), so that one whose receivers hold every slot for seconds
        # does not hold up another's deliveries until they end.
        self.threads = 2 * self.concurrency
        self.refill_at = max(1, min(REFILL_BATCH, self.concurrency // 2))
        self._free_slots = self.threads
        # Of those, how many subscriptions whose last attempt failed may still take.
        self._free_failing_slots = max(1, self.concurrency // 2)
        self._slots = threading.Condition()  # guards the two counts; notified when every slot is free
        self._pool: ThreadPoolExecutor | None = None
        # self.scan looked up at each run: a seam, so a test can count scans (tests.support.counting_scans).
        self.jobs = Jobs(lambda: self.scan(), config["DELIVERY_POLL_INTERVAL"], self.clock, config["RETENTION_DAYS"])
        self._stopping = threading.Event()
        # The attempts holding a slot here, each until its outcome is committed (or its thread gives up).
        self._attempting: set[tuple[str, str, str]] = set()
        self.courier = Courier(config, self._stopping, committed=self._free)
        self._queued = threading.Event()  # set by wake(), cleared by the next scan that has slots
        self._scan_backoff = 0.0
        self._next_scan_at = 0.0  # time.monotonic(); later while the database fails
        self._rescan_in = 0.0  # seconds until the next scan while due deliveries wait elsewhere

    # --- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        """Start the pool and the polling job (no-op when PARTNER_SCHEDULER_ENABLED is false)."""
        if not self.enabled or self._pool:
            return
        self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="delivery")
        self.jobs.start()
        log.info("delivery scanner started: concurrency=%d poll_interval=%ss",
                 self.concurrency, self.jobs.poll_interval)

    def stop(self) -> None:
        """Stop polling and wait for attempts in flight (each ends within the timeout). From the
        first moment nothing more is claimed: a finishing attempt does not refill its slot. A claim
        under way is attempted too, never given back: a give-back is a write, which the database may
        refuse (the outage that stops the worker), and the lease it leaves would count, once expired,
        as an attempt made and never recorded."""
        self._stopping.set()
        self.jobs.stop()
        if self._pool:
            self._wait_for_every_slot()
            self._pool.shutdown(wait=True)
            log.info("delivery scanner stopped")

    def _wait_for_every_slot(self) -> None:
        """Wait until every slot is free: a scan that reserved some before the stop has submitted its
        claims to the pool, still running, and their attempts have ended. No scan reserves any after
        the stop (_reserve_slots)."""
        with self._slots:
            self._slots.wait_for(lambda: self._free_slots == self.threads)

    def scheduler_state(self) -> str:
        """`running`, `disabled` (PARTNER_SCHEDULER_ENABLED false) or `stopped` (not started here)."""
        if not self.enabled:
            return "disabled"
        return "running" if self.jobs.running else "stopped"

    def wake(self) -> None:
        """Scan now rather than at the next poll: an event was just queued. If no slot is free,
        the next attempt to finish refills its slot at once instead of waiting for REFILL_BATCH
        free ones: the new event may be another organization's, whose turn comes first."""
        self._queued.set()
        self.jobs.run_soon(SCAN_JOB)

    def deleted(self, url: str) -> None:
        """A subscription to `url` was just deleted: its idle connections close now, and deleted
        subscriptions are purged now rather than at the next run."""
        self.courier.sender.close_idle_to(url)
        self.jobs.run_soon(retention.PURGE_JOB)

    # --- scanning ------------------------------------------------------------------------------

    def scan(self) -> int:
        """Claim due deliveries into the free slots and start them; returns how many started."""
        self.courier.sender.close_idle()  # at each poll at least: idle connections age while nothing is sent
        if self._stopping.is_set() or time.monotonic() < self._next_scan_at:
            return 0
        reserved, failing = self._reserve_slots()
        if not reserved:
            return 0
        self._queued.clear()  # this claim looks for whatever was queued until now
        claims: list[Claim] = []
        try:
            with db.connection_context():
                if database_outage.active:  # a claim of nothing writes nothing: prove writes commit
                    probe_write()
                claims = self._claim(reserved, failing, max(0, self._spare(reserved)))
        except Exception as error:  # noqa: BLE001 - unavailability backs off, the rest re-raised
            self._back_off(error)
            return 0
        finally:
            idle = self._release_slots(reserved - len(claims), failing - sum(c.failing for c in claims))
        self._scan_backoff = 0.0  # the outage itself ends with a committed write (availability)
        if claims:
            self._rescan_in = 0.0
        else:
            self._scan_again_when_due(idle)
        return self._start(claims)

    def _scan_again_when_due(self, idle: bool) -> None:
        """This scan took nothing. Scan again when the next delivery falls due, if the poll comes
        later: a retry then goes out at its time (its delay and jitter), not up to a poll interval
        after it. And if nothing is in flight here (`idle`) while deliveries are due (waiting behind
        other processes' attempts, or taken first by their claims), scan again after RESCAN_SECONDS,
        doubling while that lasts; if none is, the next wait starts from RESCAN_SECONDS again.
        Decided by the scan that leaves every slot free, not the one that reserved them all: scans
        running together each reserve some."""
        try:
            with db.connection_context():
                now = now_ms(self.clock)
                due, later = idle and any_due(now), next_due_at(now)
        except Exception as error:  # noqa: BLE001 - unavailability backs off, the rest re-raised
            self._back_off(error)
            return
        if later is not None:
            self.jobs.run_soon(SCAN_JOB, (later - now) / 1000)
        if idle:
            self._rescan_in = min(self.jobs.poll_interval, 2 * self._rescan_in or RESCAN_SECONDS) if due else 0.0
            if due:
                self.jobs.run_soon(SCAN_JOB, self._rescan_in)

    def _back_off(self, error: Exception) -> None:
        """The database cannot answer or write (down, disk full, locked): scan less often, log once.
        Any other error is raised again."""
        if not is_unavailable(error):
            raise error
        database_failed(error)
        self._scan_backoff = min(MAX_SCAN_BACKOFF_SECONDS, self._scan_backoff * 2 or SCAN_BACKOFF_SECONDS)
        self._next_scan_at = time.monotonic() + self._scan_backoff

    def _start(self, claims: list[Claim]) -> int:
        """Submit each claim to the pool (which stop() shuts down only once their slots are free)."""
        with self._slots:
            self._attempting.update(_slot_key(claim) for claim in claims)
        for started, claim in enumerate(claims):
            try:
                self._pool.submit(self._run_in_slot, claim)
            except RuntimeError as error:  # no thread could start: the process's own limit, not a partner's
                self._give_back(claims[started:], error)
                return started
        return len(claims)

    def _give_back(self, claims: list[Claim], error: Exception) -> None:
        """Claims no thread could take: due again now, no attempt counted, and their slots free."""
        log.warning("delivery of %d claimed deliveries not attempted (%s): due again now", len(claims), error)
        try:
            with db.connection_context():
                for claim in claims:
                    put_off(claim, now_ms(self.clock))
        finally:
            for claim in claims:
                self._free(claim)

    def run_due(self) -> int:
        """Claim and attempt every due delivery in this thread, one at a time; for tests and tools."""
        done = 0
        while True:
            with db.connection_context():
                claims = self._claim(1, None, 1)
            if not claims:
                return done
            self.courier.attempt(claims[0])
            done += 1

    def _claim(self, limit: int, failing: int | None, spare: int) -> list[Claim]:
        """Claim up to `limit` due deliveries, at most `failing` of them (None: any number) to
        subscriptions whose last attempt failed, and beyond the `spare` slots only to organizations
        below their share (outbox.claim_due)."""
        return claim_due(now_ms(self.clock), limit, self.courier.lease_ms, failing, self.auto_disable_threshold,
                         self.most_per_subscription, self.concurrency, spare)

    def _run_in_slot(self, claim: Claim) -> None:
        try:
            self.courier.attempt(claim)
        except Exception as error:  # noqa: BLE001 - logged: a pool thread's exception would vanish
            # The claim's lease expires and the attempt is made again; never lose the slot.
            if is_unavailable(error):  # the outage itself is logged once (availability)
                log.warning("delivery event=%s attempt=%d: outcome not recorded while its lease lasted (%s); "
                            "the attempt is made again", claim.event_id, claim.attempt, describe(error))
            else:
                log.exception("delivery attempt crashed: event=%s", claim.event_id)
        finally:
            self._free(claim)  # if its outcome's commit did not free it already
        # Spare slots refill in batches. An attempt on a thread beyond the slots (its organization held
        # less than its share while the slots were full) claims again as it ends, or that
        # organization's next deliveries would wait for a poll while the others hold every slot.
        spare = self._spare(self._free_slots)
        if (claim.beyond or spare >= self.refill_at or self._queued.is_set()) and not self._stopping.is_set():
            try:
                self.scan()
            except Exception:  # on a pool thread: raised, it would vanish into a Future nobody reads
                log.exception("delivery scan after an attempt failed")

    def _free(self, claim: Claim) -> None:
        """Free the slot of `claim`'s attempt, once: as its outcome is committed (the courier's group
        commit calls this for the whole batch, before its threads run again), else when its thread
        is done with it. Freed only once the thread ran again, a crowd of threads whose outcomes were
        committed but who had not yet had the CPU left the share rule, counted from the database,
        seeing an organization alone below its share: it took the threads beyond the slots. So a
        free slot may not yet be an idle thread: a claim then waits a moment in the pool's queue
        while those threads log their attempts (its lease runs meanwhile)."""
        with self._slots:
            if _slot_key(claim) in self._attempting:
                self._attempting.remove(_slot_key(claim))
                self._release_slots(1, int(claim.failing))

    def _spare(self, free: int) -> int:
        """Of `free` threads, the slots among them (at most 0 while attempts run beyond the slots)."""
        return free - (self.threads - self.concurrency)

    def _reserve_slots(self) -> tuple[int, int]:
        """Take every free slot, and as many of them as failing subscriptions may still use; none once
        the dispatcher is stopping (decided under the lock stop() waits on)."""
        with self._slots:
            if self._stopping.is_set():
                return 0, 0
            reserved, self._free_slots = self._free_slots, 0
            failing = min(reserved, self._free_failing_slots)
            self._free_failing_slots -= failing
        return reserved, failing

    def _release_slots(self, count: int, failing: int) -> bool:
        """Give back slots; whether every slot is free now (nothing in flight or claiming here)."""
        with self._slots:
            self._free_slots += count
            self._free_failing_slots += failing
            idle = self._free_slots == self.threads
            if idle:
                self._slots.notify_all()
            return idle


def _slot_key(claim: Claim) -> tuple[str, str, str]:
    """A claim's key among the attempts here: its delivery is claimed again under another lease."""
    return claim.event_id, claim.subscription_id, claim.lease_token
