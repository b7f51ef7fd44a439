"""Recording what an attempt of a claimed delivery (partner/outbox.py) came to: a success, or a
failure audited, counted and decided by the retry policy, in a write that counts only if the claim's
lease is still ours. The order in which it locks rows, and what it records for a subscription
deleted meanwhile, are the outbox's rule (its module docstring)."""

from dataclasses import dataclass

from models import Delivery, Failure
from partner import dead_letters
from partner.claims import Claim
from partner.concurrency import push_back, widen
from partner.config import DEFAULTS
from partner.outbound.transport import AttemptResult
from partner.retry import RetryPolicy
from partner.store.sql import is_sqlite, new_id, run_sql, select_rows, write_transaction

# Written once as SQL, like the outbox's statements, and for the same reason.
_FINISH = ('UPDATE delivery SET state = :state, attempts = :attempt, due_at = :due_at, lease_token = NULL, '
           'ended = COALESCE(:ended, ended) WHERE event_id = :event_id AND subscription_id = :subscription_id '
           'AND lease_token = :token')
# The attempt number is the one the claim read plus one, as outbox._claim_of counts it: the lease kept it.
# `event_id IN` first: SQLite plans a row-value IN (VALUES ...) alone as a scan of the whole table.
# Each subscription's failure streak is read by the same statement, not taken from the claim: a
# failure recorded since the claim (another delivery's, whose lease had expired) is reset too.
_FINISH_DELIVERED = ("UPDATE delivery SET state = 'delivered', attempts = attempts + 1, due_at = NULL, "
                     'lease_token = NULL WHERE event_id IN (:event_ids) '
                     'AND (event_id, subscription_id, lease_token) IN (VALUES :leases) '
                     'RETURNING event_id, subscription_id, (SELECT consecutive_failures FROM subscription '
                     'WHERE subscription.id = delivery.subscription_id) AS streak')
# Recording's half on PostgreSQL: the deliveries whose lease is still ours and whose subscription is not
# deleted, each locked and then its subscription. FOR NO KEY UPDATE, the lock the writes that follow
# take: two recordings of one subscription (a late outcome and the next delivery's) holding FOR SHARE
# would each wait for the other to let it write. Subscription by subscription in id order (rows are
# locked in the ORDER BY's order): two processes' batches of outcomes for the same subscriptions then
# never hold one each while waiting for the other's, as they did, in the order the plan met them, in
# most drains by two services (bench/scale_out: each deadlock stalled both for deadlock_timeout).
_HOLD = ('SELECT d.event_id, d.subscription_id FROM delivery AS d JOIN subscription AS s ON s.id = d.subscription_id '
         'WHERE d.event_id IN (:event_ids) AND (d.event_id, d.subscription_id, d.lease_token) IN (VALUES :leases) '
         'AND s.deleted_at IS NULL ORDER BY s.id, d.event_id FOR UPDATE OF d FOR NO KEY UPDATE OF s')
_RESET_STREAKS = ('UPDATE subscription SET consecutive_failures = 0 '
                  'WHERE id IN (:subscription_ids) AND consecutive_failures <> 0')
_COUNT_FAILURE = ('UPDATE subscription SET consecutive_failures = consecutive_failures + 1 '
                  'WHERE id = :subscription_id RETURNING consecutive_failures, active, concurrency_limit, concurrency_ceiling, '
                  'concurrency_pin, paused_until')


@dataclass(frozen=True)
class Recorded:
    """What recording an attempt did: nothing when the lease was lost (reclaimed, or the subscription
    deleted); else when the next attempt is due, or that it was dead-lettered, and any auto-disable."""
    recorded: bool
    next_attempt_at: int | None = None
    dead_lettered: bool = False
    auto_disabled: bool = False


NOT_RECORDED = Recorded(False)


@dataclass(frozen=True)
class Outcome:
    """What an attempt of a claimed delivery came to, to be recorded."""
    claim: Claim
    result: AttemptResult
    attempted_at: int
    finished_at: int
    jitter: float = 0.0  # the fraction (up to retry.MAX_JITTER) the retry delay grows by
    draw: float = 1.0  # in [0, 1): whether a success widens its subscription's limit, when chance decides


def write_outcomes(outcomes: list[Outcome], policy: RetryPolicy,
                   most: int = DEFAULTS["DELIVERY_MAX_PER_SUBSCRIPTION"]) -> list[Recorded]:
    """Record attempts whose claim's lease is still ours (and, on PostgreSQL, whose subscription is not
    deleted: module docstring): a success marks the delivery delivered, resets the subscription's
    failure streak and may widen its limit (up to `most`); a failure is audited, counted, decided by
    `policy` (next attempt, dead-letter, auto-disable), and may narrow the limit or hold the
    subscription (partner/concurrency.py). The dispatcher writes the outcomes of attempts finishing
    together at once (group_commit), in one transaction: a streak reset commits with its success, or
    neither does and the write can be made again while the lease lasts. Tests step one at a time
    (tests.support.record_attempt)."""
    made: list = []  # dead letters, reported once committed
    with write_transaction(durable=False):
        held = _held(outcomes)
        successes = [o for o in outcomes if o.result.ok and o.claim.delivery in held]
        _widen(successes, most)
        delivered = iter(_write_successes(successes))
        recorded = [NOT_RECORDED if outcome.claim.delivery not in held
                    else Recorded(next(delivered)) if outcome.result.ok
                    else record_failure(outcome.claim, outcome.result, outcome.attempted_at, outcome.finished_at,
                                         policy, outcome.jitter, made)
                    for outcome in outcomes]
    dead_letters.report(made)
    return recorded


def _held(outcomes: list[Outcome]) -> set[tuple[str, str]]:
    """The deliveries (Claim.delivery) of the outcomes to record, kept so until the caller's transaction ends. On SQLite,
    whose write transaction excludes every claim and delete: each success (its write checks its lease)
    and each failure whose lease is still ours. On PostgreSQL: those whose lease is still ours and
    whose subscription is not deleted, held (_HOLD)."""
    if is_sqlite():
        return {outcome.claim.delivery for outcome in outcomes if outcome.result.ok or _holds_lease(outcome.claim)}
    if not outcomes:
        return set()
    return {(row["event_id"], row["subscription_id"]) for row in _by_lease(_HOLD, [outcome.claim for outcome in outcomes])}


def _by_lease(template: str, claims: list[Claim]) -> list[dict]:
    """select_rows of a statement naming `claims` by event id (:event_ids) and by delivery and lease (:leases)."""
    return select_rows(template, {"event_ids": [claim.event_id for claim in claims],
                                  "leases": [(*claim.delivery, claim.lease_token) for claim in claims]})


def _widen(successes: list[Outcome], most: int) -> None:
    """Widen the limits the successes call for, before they leave flight (concurrency.widen)."""
    draws: dict[str, list[float]] = {}
    for outcome in successes:
        if outcome.claim.may_widen:
            draws.setdefault(outcome.claim.subscription_id, []).append(outcome.draw)
    if draws:
        widen(draws, max(outcome.finished_at for outcome in successes), most)


def _write_successes(outcomes: list[Outcome]) -> list[bool]:
    """Mark delivered each success whose lease is still ours, and reset the failure streak of their
    subscriptions that have one; whether each was recorded."""
    if not outcomes:
        return []
    claims = [outcome.claim for outcome in outcomes]
    finished = _by_lease(_FINISH_DELIVERED, claims)
    streaks = {row["subscription_id"] for row in finished if row["streak"]}
    if streaks:
        run_sql(_RESET_STREAKS, {"subscription_ids": sorted(streaks)})
    delivered = {(row["event_id"], row["subscription_id"]) for row in finished}
    return [claim.delivery in delivered for claim in claims]


def record_failure(claim: Claim, result: AttemptResult, attempted_at: int, finished_at: int,
                    policy: RetryPolicy, jitter: float, made: list) -> Recorded:
    """Audit and count a failed attempt whose lease is ours, and decide what follows by `policy`; a
    dead letter or an auto-disable it makes is added to `made`. Call inside a write transaction."""
    [streak] = select_rows(_COUNT_FAILURE, {"subscription_id": claim.subscription_id})
    held_until = push_back(claim.subscription_id, streak, result, finished_at)
    active = bool(streak["active"])
    decision = policy.after_failure(claim.attempt, streak["consecutive_failures"], active, finished_at, jitter)
    # The next attempt: its retry time, or the end of the subscription's hold if that comes later.
    next_at = decision.next_attempt_at and max(decision.next_attempt_at, held_until or 0)
    why = None
    if next_at is None:
        dead, why = dead_letters.after_failure(claim, result.error, decision.auto_disable, active, finished_at, policy)
        made += dead
    run_sql(_FINISH, {"state": Delivery.PENDING if next_at else Delivery.DEAD, "attempt": claim.attempt,
                      "due_at": next_at, "ended": why, "event_id": claim.event_id,
                      "subscription_id": claim.subscription_id, "token": claim.lease_token})
    Failure.create(id=new_id("fail"), subscription=claim.subscription_id, event=claim.event_id,
                   attempt=claim.attempt, http_status=result.http_status, error=result.error,
                   response_excerpt=result.response_excerpt, duration_ms=result.duration_ms,
                   attempted_at=attempted_at, next_attempt_at=next_at, error_detail=result.error_detail)
    return Recorded(True, next_at, next_at is None, decision.auto_disable)


def _holds_lease(claim: Claim) -> bool:
    """Whether the claim's lease is still ours (on SQLite, whose write transaction keeps it so)."""
    return (Delivery.select(Delivery.event)
            .where((Delivery.event == claim.event_id) & (Delivery.subscription == claim.subscription_id)
                   & (Delivery.lease_token == claim.lease_token)).exists())
