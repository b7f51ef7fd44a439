"""The delivery dispatcher: scans for due deliveries and runs attempts on a bounded pool.

One APScheduler job polls every DELIVERY_POLL_INTERVAL seconds; `wake()` runs it at once when an
event is queued, and every finished attempt refills its slot straight away. Nothing here starts
on import or in create_app: gunicorn's post_worker_init hook calls `start()`.

Dead endpoints must not starve healthy ones. An attempt to an endpoint that hangs holds its slot
until the deadline, and before its first timeout nothing tells it from a slow healthy one. So the
pool is large (DELIVERY_CONCURRENCY, default 64: a thread waiting on a socket costs little), a
subscription's attempts in flight are held to its limit (partner/concurrency.py: 1 until its
receiver answers, and narrowed by every timeout), and subscriptions whose last attempt failed may
hold at most half of the slots together: however many endpoints are dead, once they have failed
once they leave the other half to the healthy ones.
"""

import dataclasses
import functools
import logging
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from partner import retention
from partner.claims import any_due, next_due_at
from partner.jobs import SCAN_JOB, Jobs
from partner.outbound.dns import LookupsBusy
from partner.outbound.sender import Sender
from partner.outbox import Claim, claim_due, put_off, release
from partner.outcomes import NOT_RECORDED, Outcome, Recorded, write_outcomes
from partner.retry import MAX_JITTER, RetryPolicy
from partner.store.availability import database_failed, database_outage, describe, is_unavailable
from partner.store.connection import db
from partner.store.group_commit import GroupCommit
from partner.store.sql import probe_write
from partner.telemetry.attempts import log_attempt
from partner.timestamps import now_ms, to_ms

log = logging.getLogger(__name__)

# A claim outlives the longest attempt by this much before another scanner may take it over.
LEASE_MARGIN_SECONDS = 30
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
# An outcome that could not be written is written again after these pauses (seconds), while the
# lease lasts, rather than the attempt being made again when the lease expires.
RECORD_RETRY_SECONDS = (0.5, 1, 2, 4, 8)
# A delivery whose host's lookup could not start is due again this much later (seconds). Lookups that
# fill a bound are slow ones, and one stuck on a name that never answers ends with the resolver's
# first timeout (5 s) at the soonest: asked sooner, the bound is still full, and every refusal costs
# a claim and a write (an organization with 100 dead names pinged: 160 a second at 1 s).
LOOKUP_BUSY_RETRY_SECONDS = 5


class Dispatcher:
    """Claims due deliveries into free slots of a thread pool and records each attempt."""

    def __init__(self, config):
        self.config, self.clock = config, config["CLOCK"]
        self.timeout = config["DELIVERY_TIMEOUT"]
        self.policy = RetryPolicy(config["DELIVERY_RETRY_DELAYS"], config["AUTO_DISABLE_THRESHOLD"])
        self.concurrency = config["DELIVERY_CONCURRENCY"]
        self.most_per_subscription = config["DELIVERY_MAX_PER_SUBSCRIPTION"]
        self.enabled = config["SCHEDULER_ENABLED"]
        self.lease_ms = to_ms(self.timeout + LEASE_MARGIN_SECONDS)
        self.refill_at = max(1, min(REFILL_BATCH, self.concurrency // 2))
        self.random = random.Random()
        # Outcomes of attempts finishing together are written at once.
        self.outcomes = GroupCommit(lambda outcomes: write_outcomes(outcomes, self.policy, self.most_per_subscription))
        # The record step and its pauses between tries: seams, so a test can make it fail every time.
        self.record, self.record_pauses = self.outcomes.run, RECORD_RETRY_SECONDS
        self._free_slots = self.concurrency
        # Of those, how many subscriptions whose last attempt failed may still take.
        self._free_failing_slots = max(1, self.concurrency // 2)
        self._slots_lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        # self.scan looked up at each run: a seam, so a test can count scans (tests.support.counting_scans).
        self.jobs = Jobs(lambda: self.scan(), config["DELIVERY_POLL_INTERVAL"], self.clock, config["RETENTION_DAYS"])
        self._stopping = threading.Event()
        self._queued = threading.Event()  # set by wake(), cleared by the next scan that has slots
        self._scan_backoff = 0.0
        self._next_scan_at = 0.0  # time.monotonic(); later while the database fails
        self._rescan_in = 0.0  # seconds until the next scan while due deliveries wait elsewhere

    @functools.cached_property
    def sender(self) -> Sender:
        """Built at first use, not with the app: it loads PARTNER_DELIVERY_CA_BUNDLE (ValueError if it
        cannot), which the start-up step checks before serving."""
        return Sender(self.config)

    # --- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        """Start the pool and the polling job (no-op when PARTNER_SCHEDULER_ENABLED is false)."""
        if not self.enabled or self._pool:
            return
        self._pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="delivery")
        self.jobs.start()
        log.info("delivery scanner started: concurrency=%d poll_interval=%ss",
                 self.concurrency, self.jobs.poll_interval)

    def stop(self) -> None:
        """Stop polling and wait for attempts in flight (each ends within the timeout). From the
        first moment nothing more is claimed: a finishing attempt does not refill its slot."""
        self._stopping.set()
        self.jobs.stop()
        if self._pool:
            self._pool.shutdown(wait=True)
            log.info("delivery scanner stopped")

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

    def purge_soon(self) -> None:
        """Purge deleted subscriptions now rather than at the next run: one was just deleted."""
        self.jobs.run_soon(retention.PURGE_JOB)

    # --- scanning ------------------------------------------------------------------------------

    def scan(self) -> int:
        """Claim due deliveries into the free slots and start them; returns how many started."""
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
                claims = claim_due(now_ms(self.clock), reserved, self.lease_ms, failing,
                                   self.policy.auto_disable_threshold, self.most_per_subscription)
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
        """Submit each claim to the pool; give back what a stopping pool no longer takes."""
        for started, claim in enumerate(claims):
            try:
                self._pool.submit(self._run_in_slot, claim)
            except RuntimeError:  # the pool was shut down between the claim and now
                self._abandon(claims[started:])
                return started
        return len(claims)

    def _abandon(self, claims: list[Claim]) -> None:
        self._release_slots(len(claims), sum(c.failing for c in claims))
        with db.connection_context():
            released = release(claims, now_ms(self.clock))
        log.warning("delivery scanner stopping: gave back %d claimed deliveries (due now, for the "
                    "next process): %s", released, " ".join(c.event_id for c in claims))

    def run_due(self) -> int:
        """Claim and attempt every due delivery in this thread, one at a time; for tests and tools."""
        done = 0
        while True:
            with db.connection_context():
                claims = claim_due(now_ms(self.clock), 1, self.lease_ms, None, self.policy.auto_disable_threshold,
                                   self.most_per_subscription)
            if not claims:
                return done
            self.attempt(claims[0])
            done += 1

    def _run_in_slot(self, claim: Claim) -> None:
        try:
            self.attempt(claim)
        except Exception as error:  # noqa: BLE001 - logged: a pool thread's exception would vanish
            # The claim's lease expires and the attempt is made again; never lose the slot.
            if is_unavailable(error):  # the outage itself is logged once (availability)
                log.warning("delivery event=%s attempt=%d: outcome not recorded while its lease lasted (%s); "
                            "the attempt is made again", claim.event_id, claim.attempt, describe(error))
            else:
                log.exception("delivery attempt crashed: event=%s", claim.event_id)
        finally:
            self._release_slots(1, int(claim.failing))
        if (self._free_slots >= self.refill_at or self._queued.is_set()) and not self._stopping.is_set():
            try:
                self.scan()
            except Exception:  # on a pool thread: raised, it would vanish into a Future nobody reads
                log.exception("delivery scan after an attempt failed")

    def _reserve_slots(self) -> tuple[int, int]:
        """Take every free slot, and as many of them as failing subscriptions may still use."""
        with self._slots_lock:
            reserved, self._free_slots = self._free_slots, 0
            failing = min(reserved, self._free_failing_slots)
            self._free_failing_slots -= failing
        return reserved, failing

    def _release_slots(self, count: int, failing: int) -> bool:
        """Give back slots; whether every slot is free now (nothing in flight or claiming here)."""
        with self._slots_lock:
            self._free_slots += count
            self._free_failing_slots += failing
            return self._free_slots == self.concurrency

    # --- one attempt ---------------------------------------------------------------------------

    def attempt(self, claim: Claim) -> Recorded:
        """Make one attempt of a claimed delivery: send, record, log."""
        attempted_at = now_ms(self.clock)
        try:
            result = self.sender.send(claim, attempted_at)
        except LookupsBusy as error:
            return self._put_off(claim, error)
        outcome = Outcome(claim, result, attempted_at, now_ms(self.clock), self.random.uniform(0, MAX_JITTER),
                          self.random.random())
        recorded = self._record(outcome)
        log_attempt(outcome, recorded)
        return recorded

    def _put_off(self, claim: Claim, error: LookupsBusy) -> Recorded:
        """No lookup of the claim's host could start: its tenant's own lookups, or every thread, held
        by lookups still running (partner/outbound/dns.py). Nothing was sent, so nothing is counted
        against the subscription: the delivery is given back, due again in LOOKUP_BUSY_RETRY_SECONDS.
        Should that write fail (the database down), the lease runs out and the delivery is taken again
        then, counted as an attempt whose outcome was not recorded, as any attempt an outage cuts short."""
        due_ms = now_ms(self.clock) + to_ms(LOOKUP_BUSY_RETRY_SECONDS)
        with db.connection_context():
            put_off(claim, due_ms)
        log.info("delivery event=%s subscription=%s not attempted: DNS lookup not started (%s); due again "
                 "in %s s", claim.event_id, claim.subscription_id, error, LOOKUP_BUSY_RETRY_SECONDS)
        return NOT_RECORDED

    def _record(self, outcome: Outcome) -> Recorded:
        """Write the outcome; when that fails, write it again with backoff while the lease lasts
        (an outage, a full disk), without its response excerpt if the text itself was refused,
        rather than letting the lease expire and the attempt be made again."""
        claim = outcome.claim
        deadline = claim.claimed_at + self.lease_ms / 1000 - LEASE_MARGIN_SECONDS / 2
        pauses = iter(self.record_pauses)
        while True:
            try:
                return self.record(outcome)
            except Exception as error:  # noqa: BLE001 - logged, then retried or re-raised
                pause = next(pauses, None)
                if pause is None or time.monotonic() + pause > deadline:
                    raise
                # An outage is the operator's to act on once (database_failed logs it), not per outcome.
                unavailable = is_unavailable(error)
                if unavailable:
                    database_failed(error)
                log.log(logging.WARNING if unavailable else logging.ERROR,
                        "delivery event=%s attempt=%d: outcome not recorded (%s), again in %s s",
                        claim.event_id, claim.attempt, describe(error), pause)
                if not unavailable:
                    outcome = dataclasses.replace(
                        outcome, result=dataclasses.replace(outcome.result, response_excerpt=""))
                if self._stopping.wait(pause) and unavailable:
                    raise

