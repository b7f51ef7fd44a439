"""What the operator does to deliveries (`flask deliveries`): list them across subscriptions, show
one event's whole story (why it failed, why it ended), replay dead letters."""

from dataclasses import dataclass

from peewee import fn

from models import Delivery, Event, Failure, Organization, Subscription
from partner import safe_text
from partner.store.sql import is_sqlite, write_transaction
from partner.dead_letters import ATTEMPTS
from partner.errors import OperatorError
from partner.retry import RetryPolicy, max_attempts
from partner.subscriptions import LIVE
from partner.timestamps import iso

STATES = (Delivery.PENDING, Delivery.IN_FLIGHT, Delivery.DELIVERED, Delivery.DEAD)


@dataclass(frozen=True)
class DeliveryRow:
    event_id: str
    subscription_id: str
    organization: str
    kind: str
    state: str
    attempts: int
    created_at: int
    # Open: when it is next due. Dead: when its last attempt ended. Delivered: not recorded (None).
    due_or_finished_at: int | None


def list_deliveries(subscription_id: str | None = None, organization: str | None = None, state: str | None = None,
                    since_ms: int | None = None, limit: int = 50) -> list[DeliveryRow]:
    """Deliveries of every subscription not deleted (or of one, or of one organization's), newest
    event first; `since_ms` keeps events created at or after it. An unknown subscription or
    organization is refused, naming it."""
    if subscription_id is not None:
        _find(subscription_id)
    if organization is not None and not Organization.select().where(Organization.slug == organization).exists():
        raise OperatorError(f"No organization {organization!r}.")
    last_attempt_end = (Failure.select(fn.MAX(Failure.attempted_at + Failure.duration_ms))
                        .where((Failure.event == Delivery.event) & (Failure.subscription == Delivery.subscription)))
    query = (Delivery.select(Delivery.event, Delivery.subscription, Organization.slug, Event.kind, Delivery.state,
                             Delivery.attempts, Event.created_at, Delivery.due_at, last_attempt_end.alias("finished_at"))
             .join(Event).switch(Delivery).join(Subscription).join(Organization).where(LIVE)
             .order_by(Event.created_at.desc(), Event.id.desc(), Delivery.subscription).limit(limit))
    for wanted, condition in ((subscription_id, Delivery.subscription == subscription_id),
                              (organization, Organization.slug == organization), (state, Delivery.state == state),
                              (since_ms, Event.created_at >= since_ms)):
        if wanted is not None:
            query = query.where(condition)
    return [DeliveryRow(event_id, subscription, slug, kind, state, attempts, created_at,
                        finished_at if state == Delivery.DEAD else due_at)
            for event_id, subscription, slug, kind, state, attempts, created_at, due_at, finished_at in query.tuples()]


@dataclass(frozen=True)
class Attempt:
    number: int
    attempted_at: int | None  # None for a success: the service records no time for one
    outcome: str  # "failed" or "delivered"
    http_status: int | None
    error: str | None
    error_detail: str | None
    duration_ms: int | None
    excerpt: str


@dataclass(frozen=True)
class DeliveryStory:
    """One event's delivery to one subscription as `flask deliveries show` tells it."""
    event_id: str
    kind: str
    created_at: int
    subscription: Subscription  # its organization's slug at subscription.organization.slug
    state: str
    attempts: list[Attempt]  # in the order they were made
    unrecorded: int  # attempts made whose outcome was never written (counted again when claimed)
    ending: str  # why it ended, or when it is next due

    @property
    def has_ended(self) -> bool:
        return self.state in (Delivery.DELIVERED, Delivery.DEAD)


def delivery_stories(event_id: str, now_ms: int, policy: RetryPolicy,
                     subscription_id: str | None = None) -> list[DeliveryStory]:
    """The event's delivery to each of its subscriptions (or to `subscription_id` alone), oldest
    subscription first: every attempt in order and why it ended (or when it is next due), judged by
    `policy` (the configured retry schedule and threshold). Refused, naming the event, if unknown (or
    not of `subscription_id`). The failure records hold the failed attempts; a success is not recorded
    as a row of its own: it is the delivery's last attempt, shown without a time."""
    query = (Delivery.select(Delivery, Event, Subscription, Organization).join(Event).switch(Delivery)
             .join(Subscription).join(Organization).where(Delivery.event == event_id)
             .order_by(Subscription.created_at, Subscription.id))
    if subscription_id is not None:
        query = query.where(Delivery.subscription == subscription_id)
    # An id with a control character was never issued, and PostgreSQL refuses NUL in a query.
    deliveries = [] if safe_text.has_controls(event_id) else list(query)
    if not deliveries:
        of = f" of subscription {subscription_id}" if subscription_id is not None else ""
        raise OperatorError(f"No event {event_id!r}{of}.")
    return [_story(delivery, now_ms, policy) for delivery in deliveries]


def _story(delivery: Delivery, now_ms: int, policy: RetryPolicy) -> DeliveryStory:
    event_id = delivery.event.id
    failures = list(Failure.select().where((Failure.event == event_id) & (Failure.subscription == delivery.subscription))
                    .order_by(Failure.attempted_at, Failure.id))
    attempts = [Attempt(f.attempt, f.attempted_at, "failed", f.http_status, f.error, f.error_detail, f.duration_ms,
                        f.response_excerpt) for f in failures]
    if delivery.state == Delivery.DELIVERED:
        attempts.append(Attempt(delivery.attempts, None, "delivered", None, None, None, None, ""))
    return DeliveryStory(event_id, delivery.event.kind, delivery.event.created_at, delivery.subscription,
                         delivery.state, attempts, delivery.unrecorded,
                         _ending(delivery, failures[-1] if failures else None, now_ms, policy))


def _ending(delivery: Delivery, last_failure: Failure | None, now_ms: int, policy: RetryPolicy) -> str:
    """Why the delivery ended, or what comes next, in words."""
    subscription, following, most = delivery.subscription, delivery.attempts + 1, max_attempts(policy.delays)
    if delivery.state == Delivery.DELIVERED:
        return f"delivered on attempt {delivery.attempts}"
    if delivery.state == Delivery.IN_FLIGHT:
        return (f"attempt {following} in flight; made again after {iso(delivery.due_at)} if its outcome is "
                f"never written")
    if delivery.state == Delivery.PENDING:
        when = "due at" if delivery.due_at > now_ms else "due since"
        return f"attempt {following} of at most {most} {when} {iso(delivery.due_at)}"
    if delivery.ended is not None:  # recorded as it ended, with the figures in force then
        return delivery.ended.replace(ATTEMPTS, str(delivery.attempts))
    # Dead-lettered before release 1.4 recorded why: read from the data and today's settings.
    if last_failure is not None and last_failure.error == "not_recorded":
        return "not recorded: attempts were made whose outcome could never be written, and it was dead-lettered"
    if delivery.attempts >= most:
        return f"retries exhausted: attempt {delivery.attempts} failed, the last the retry schedule allows"
    when = f" at {iso(subscription.auto_disabled_at)}" if subscription.auto_disabled_at else " (since re-enabled)"
    return (f"auto-disabled: the subscription was auto-disabled{when} after {policy.auto_disable_threshold} "
            f"failures in a row, and this delivery was dead-lettered after {delivery.attempts} of at most {most} "
            f"attempts")


def replay_dead_letters(subscription_id: str, now_ms: int, since_ms: int | None = None,
                        event_id: str | None = None) -> int:
    """Queue the subscription's dead-lettered deliveries again, due now, with a fresh set of attempts
    (unrecorded ones included: one dead-lettered `not_recorded` is sent again, not dead at once). The
    events keep their id and body bytes. Refused while the subscription is disabled. Returns how many
    were queued; `since_ms` keeps events that occurred at or after it, `event_id` one event."""
    with write_transaction():
        subscription = _find(subscription_id, lock=True)
        if not subscription.active:
            raise OperatorError(f"Subscription {subscription_id} is disabled: enable it first "
                                f"(flask webhooks enable {subscription_id}).")
        replayed = (Delivery.update(state=Delivery.PENDING, attempts=0, unrecorded=0, due_at=now_ms, lease_token=None,
                                    ended=None)
                    .where((Delivery.subscription == subscription_id) & (Delivery.state == Delivery.DEAD)))
        if since_ms is not None:
            replayed = replayed.where(Delivery.event.in_(Event.select(Event.id).where(Event.created_at >= since_ms)))
        if event_id is not None:
            replayed = replayed.where(Delivery.event == event_id)
        return replayed.execute()


def _find(subscription_id: str, lock: bool = False) -> Subscription:
    query = Subscription.select().where((Subscription.id == subscription_id) & LIVE)
    if lock and not is_sqlite():
        query = query.for_update()  # an auto-disable of this subscription waits for the replay
    subscription = query.first()
    if subscription is None:
        raise OperatorError(f"No subscription {subscription_id!r}.")
    return subscription
