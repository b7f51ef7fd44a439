"""Dead letters as the operator sees them. Dead-lettering a subscription's open deliveries when it is
disabled, and reporting every dead letter and auto-disable once the transaction that made it has
committed: one WARNING line each (logger `delivery`, beside the attempts' lines) and the metrics.

An auto-disable is one line naming how many deliveries it dead-lettered (the failing one and the
subscription's other open ones), not a line per delivery; every other dead letter is a line of its
own. `partner_deliveries_dead_lettered_total` counts each of them once: a delivery an auto-disable
swept while its attempt was under way is not counted again when that attempt fails.
"""

import logging
from dataclasses import dataclass

from models import Delivery, Organization, Subscription
from partner import queue
from partner.retry import RetryPolicy, max_attempts
from partner.store.sql import run_sql, select_rows
from partner.telemetry import metrics
from partner.timestamps import iso

log = logging.getLogger("delivery")

# A swept pending delivery will not be attempted again: its last failure record says so.
_NO_NEXT_ATTEMPT = ("UPDATE failure SET next_attempt_at = NULL WHERE next_attempt_at IS NOT NULL "
                    "AND subscription_id = :subscription_id AND event_id IN "
                    "(SELECT event_id FROM delivery WHERE subscription_id = :subscription_id AND state = :pending) "
                    "AND attempted_at = (SELECT MAX(f.attempted_at) FROM failure AS f WHERE f.event_id = failure.event_id "
                    "AND f.subscription_id = failure.subscription_id)")
_SWEEP = ("UPDATE delivery SET state = :dead, due_at = NULL, ended = :why WHERE subscription_id = :subscription_id "
          f"AND {queue.OPEN} AND event_id <> :except_event_id RETURNING event_id, attempts")
# In a dead letter's recorded ending (delivery.ended), its own number of attempts: `flask deliveries show`
# fills it from the delivery's row, so that one text serves every delivery an auto-disable sweeps.
ATTEMPTS = "{attempts}"


@dataclass(frozen=True)
class DeadLetter:
    event_id: str
    subscription_id: str
    organization: str
    attempts: int
    reason: str  # retries_exhausted, not_recorded, or subscription_disabled (found queued for a disabled one)


@dataclass(frozen=True)
class AutoDisable:
    subscription_id: str
    organization: str
    threshold: int
    event_id: str  # the delivery whose failure reached the threshold, dead-lettered with the others
    swept: int  # the subscription's other open deliveries it dead-lettered


def ending(reason: str, policy: RetryPolicy | None = None, at_ms: int | None = None) -> str:
    """Why a dead letter ended, in words, with the figures in force as it ends (`delivery.ended`,
    which `flask deliveries show` prints whatever the settings are by then): `reason` as DeadLetter's,
    or auto_disabled (at `at_ms`). `policy`: the retry schedule and threshold in force; None where
    they are not known (a claim that finds the subscription disabled)."""
    most = max_attempts(policy.delays) if policy is not None else None
    of_most = f" of at most {most}" if most is not None else ""
    if reason == "auto_disabled":
        return (f"auto-disabled: the subscription was auto-disabled at {iso(at_ms)} after "
                f"{policy.auto_disable_threshold} failures in a row, and this delivery was dead-lettered after "
                f"{ATTEMPTS}{of_most} attempts")
    if reason == "retries_exhausted":
        return f"retries exhausted: attempt {ATTEMPTS} failed, the last the retry schedule allows"
    if reason == "not_recorded":
        return "not recorded: attempts were made whose outcome could never be written, and it was dead-lettered"
    return f"subscription disabled: it was found disabled, and this delivery was dead-lettered after {ATTEMPTS}{of_most} attempts"


def after_failure(claim, error: str, auto_disable: bool, active: bool, now_ms: int,
                  policy: RetryPolicy) -> tuple[list, str | None]:
    """What a failed attempt of `claim` (an outbox.Claim) after which no attempt follows dead-letters,
    to report, and why the delivery ended (None: a disable dead-lettered it while its attempt was under
    way, and said why then): an auto-disable (the subscription disabled at `now_ms`, its other open
    deliveries dead-lettered), or this delivery alone. `active`: the subscription's state before this
    failure; `policy`: the schedule and threshold in force. The caller finishes the failing delivery.
    Call inside a write transaction."""
    if not active and _is_dead(claim.event_id, claim.subscription_id):
        return [], None
    organization = _organization_of(claim.subscription_id)
    if auto_disable:
        Subscription.update(active=False, auto_disabled_at=now_ms).where(Subscription.id == claim.subscription_id).execute()
        why = ending("auto_disabled", policy, now_ms)
        swept = _dead_letter_open(claim.subscription_id, why, except_event_id=claim.event_id)
        return [AutoDisable(claim.subscription_id, organization, policy.auto_disable_threshold, claim.event_id,
                            len(swept))], why
    reason = "not_recorded" if error == "not_recorded" else "retries_exhausted" if active else "subscription_disabled"
    return [DeadLetter(claim.event_id, claim.subscription_id, organization, claim.attempt, reason)], ending(reason, policy)


def of_disabled(subscription_id: str, dead: list[dict]) -> list:
    """Dead-letter a disabled subscription's open deliveries, found queued by a claim which dead-lettered
    `dead` (rows with event_id and attempts) already; every one of them, to report. Call inside a
    write transaction."""
    organization = _organization_of(subscription_id)
    return [DeadLetter(row["event_id"], subscription_id, organization, row["attempts"], "subscription_disabled")
            for row in [*dead, *_dead_letter_open(subscription_id, ending("subscription_disabled"))]]


def _dead_letter_open(subscription_id: str, why: str, except_event_id: str = "") -> list[dict]:
    """Dead-letter the subscription's open deliveries (but one); each one's event_id and attempts.
    In-flight ones keep their lease token, so an attempt still running records its outcome, while
    one whose process died is never claimed again."""
    run_sql(_NO_NEXT_ATTEMPT, {"subscription_id": subscription_id, "pending": Delivery.PENDING})
    swept = {"dead": Delivery.DEAD, "why": why, "subscription_id": subscription_id, "except_event_id": except_event_id}
    return select_rows(_SWEEP, swept)


def _is_dead(event_id: str, subscription_id: str) -> bool:
    return Delivery.select().where((Delivery.event == event_id) & (Delivery.subscription == subscription_id)
                                   & (Delivery.state == Delivery.DEAD)).exists()


def _organization_of(subscription_id: str) -> str:
    return (Organization.select(Organization.slug).join(Subscription, on=Subscription.organization == Organization.id)
            .where(Subscription.id == subscription_id).scalar())


def report(made: list) -> None:
    """Log and count the dead letters and auto-disables (DeadLetter, AutoDisable) of a committed transaction."""
    for item in made:
        if isinstance(item, AutoDisable):
            metrics.AUTO_DISABLED.inc()
            metrics.DEAD_LETTERED.inc(1 + item.swept)
            fields = {"subscription_id": item.subscription_id, "organization": item.organization,
                      "threshold": item.threshold, "event_id": item.event_id, "dead_lettered": 1 + item.swept,
                      "swept": item.swept}
            log.warning("auto-disabled subscription=%(subscription_id)s organization=%(organization)s "
                        "threshold=%(threshold)d event=%(event_id)s dead_lettered=%(dead_lettered)d (the failing "
                        "delivery and %(swept)d open ones); `flask webhooks enable %(subscription_id)s` re-enables it",
                        fields, extra=fields)
        else:
            metrics.DEAD_LETTERED.inc()
            fields = {"event_id": item.event_id, "subscription_id": item.subscription_id,
                      "organization": item.organization, "attempts": item.attempts, "reason": item.reason}
            log.warning("dead-lettered event=%(event_id)s subscription=%(subscription_id)s "
                        "organization=%(organization)s attempts=%(attempts)d reason=%(reason)s; "
                        "`flask deliveries show %(event_id)s` says why", fields, extra=fields)
