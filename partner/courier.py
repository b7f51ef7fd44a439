"""One attempt of a claimed delivery, on a slot of the dispatcher (delivery.py): sent
(partner/outbound/sender.py), its outcome recorded (partner/outcomes.py), written again while the
lease lasts if it could not be, and logged (partner/telemetry/attempts.py)."""

import dataclasses
import functools
import logging
import random
import threading
import time
from collections.abc import Callable

from partner.errors import OurResourcesBusy
from partner.outbound.sender import Sender
from partner.claims import Claim
from partner.outbox import put_off
from partner.outcomes import NOT_RECORDED, Outcome, Recorded, write_outcomes
from partner.retry import MAX_JITTER, RetryPolicy
from partner.store.availability import database_failed, describe, is_unavailable
from partner.store.connection import db
from partner.store.group_commit import GroupCommit
from partner.telemetry import metrics
from partner.telemetry.attempts import log_attempt
from partner.timestamps import now_ms, to_ms

log = logging.getLogger("delivery")  # the dispatcher's: operators filter on it

# A claim outlives the longest attempt by this much before another scanner may take it over.
LEASE_MARGIN_SECONDS = 30
# An outcome that could not be written is written again after these pauses (seconds), while the
# lease lasts, rather than the attempt being made again when the lease expires.
RECORD_RETRY_SECONDS = (0.5, 1, 2, 4, 8)


class Courier:
    """Makes one attempt of a claimed delivery: send, record, log. `stopping` cuts short the pauses
    between tries to record; `committed` is told of each claim whose outcome was committed, as the
    commit ends (by the thread that wrote it)."""

    def __init__(self, config, stopping: threading.Event, committed: Callable[[Claim], None] = lambda claim: None):
        self.config, self.clock, self._stopping = config, config["CLOCK"], stopping
        self.lease_ms = to_ms(config["DELIVERY_TIMEOUT"] + LEASE_MARGIN_SECONDS)
        self.policy = RetryPolicy(config["DELIVERY_RETRY_DELAYS"], config["AUTO_DISABLE_THRESHOLD"])
        most = config["DELIVERY_MAX_PER_SUBSCRIPTION"]
        self.random = random.Random()
        # Outcomes of attempts finishing together are written at once.
        self.outcomes = GroupCommit(lambda outcomes: write_outcomes(outcomes, self.policy, most),
                                    lambda outcome: committed(outcome.claim))
        # The record step and its pauses between tries: seams, so a test can make it fail every time.
        self.record, self.record_pauses = self.outcomes.run, RECORD_RETRY_SECONDS

    @functools.cached_property
    def sender(self) -> Sender:
        """Built at first use, not with the app: it loads PARTNER_DELIVERY_CA_BUNDLE (ValueError if it
        cannot), which the start-up step checks before serving."""
        return Sender(self.config)

    def attempt(self, claim: Claim) -> Recorded:
        """Make one attempt of a claimed delivery: send, record, log."""
        attempted_at = now_ms(self.clock)
        try:
            result = self.sender.send(claim, attempted_at)
        except OurResourcesBusy as error:
            return self._put_off(claim, error)
        metrics.observe_lag(claim, attempted_at)  # an attempt was made (a put-off one was not)
        outcome = Outcome(claim, result, attempted_at, now_ms(self.clock), self.random.uniform(0, MAX_JITTER),
                          self.random.random())
        recorded = self._record(outcome)
        log_attempt(outcome, recorded)
        if recorded.auto_disabled:
            self.sender.close_idle_to(claim.url)
        return recorded

    def _put_off(self, claim: Claim, error: OurResourcesBusy) -> Recorded:
        """What the attempt needed of this process was taken: a lookup of the claim's host could not
        start (its tenant's own lookups, or every thread, held by lookups still running:
        partner/outbound/dns.py), or no socket could be had (the descriptor budget spent, or none left:
        partner/outbound/sockets.py). Nothing was sent, so nothing is counted against the
        subscription: the delivery is given back, due again in `error.retry_seconds`. Should that write
        fail (the database down), the lease runs out and the delivery is taken again then, counted as an
        attempt whose outcome was not recorded, as any attempt an outage cuts short."""
        due_ms = now_ms(self.clock) + to_ms(error.retry_seconds)
        with db.connection_context():
            put_off(claim, due_ms)
        log.info("delivery event=%s subscription=%s not attempted: %s (%s); due again in %s s",
                 claim.event_id, claim.subscription_id, error.what, error, error.retry_seconds)
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
