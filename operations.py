"""What the operator does to subscriptions and their deliveries (`flask webhooks`, `flask deliveries`):
an overview with counts, re-enabling after an auto-disable, listing deliveries, replaying dead letters."""

from dataclasses import dataclass

from peewee import fn

from models import (Delivery, Event, Failure, Organization, Subscription, is_sqlite,
                    write_transaction)

OPEN_STATES = (Delivery.PENDING, Delivery.IN_FLIGHT)
STATES = (Delivery.PENDING, Delivery.IN_FLIGHT, Delivery.DELIVERED, Delivery.DEAD)


class OperatorError(Exception):
    """A refusal the operator must read: the command exits 1 with this message."""


@dataclass(frozen=True)
class DeliveryRow:
    event_id: str
    kind: str
    state: str
    attempts: int
    created_at: int
    # Open: when it is next due. Dead: when its last attempt ended. Delivered: not recorded (None).
    due_or_finished_at: int | None


def subscriptions_overview(slug: str | None = None, disabled_only: bool = False) -> list[Subscription]:
    """Every subscription (of one organization), each with `pending` (open) and `dead` counts,
    counted on the (subscription_id, state) index."""
    def count(states):
        return (Delivery.select(fn.COUNT(Delivery.event))
                .where((Delivery.subscription == Subscription.id) & Delivery.state.in_(states)))
    query = (Subscription.select(Subscription, Organization, count(OPEN_STATES).alias("pending"),
                                 count((Delivery.DEAD,)).alias("dead"))
             .join(Organization).order_by(Organization.slug, Subscription.created_at, Subscription.id))
    if slug:
        query = query.where(Organization.slug == slug)
    if disabled_only:
        query = query.where(Subscription.active == False)  # noqa: E712 (peewee builds SQL from ==)
    return list(query)


def enable_subscription(subscription_id: str) -> Subscription:
    """Re-enable an auto-disabled subscription with a clean failure streak. Its dead letters stay
    dead: enabling resends nothing (see replay_dead_letters)."""
    with write_transaction():
        updated = (Subscription.update(active=True, auto_disabled_at=None, consecutive_failures=0)
                   .where(Subscription.id == subscription_id).execute())
    if not updated:
        raise OperatorError(f"No subscription {subscription_id!r}.")
    return Subscription.get_by_id(subscription_id)


def list_deliveries(subscription_id: str, state: str | None, limit: int) -> list[DeliveryRow]:
    """The subscription's deliveries, newest event first."""
    _find(subscription_id)
    last_attempt_end = (Failure.select(fn.MAX(Failure.attempted_at + Failure.duration_ms))
                        .where(Failure.event == Delivery.event))
    query = (Delivery.select(Delivery.event, Event.kind, Delivery.state, Delivery.attempts,
                             Event.created_at, Delivery.due_at, last_attempt_end.alias("finished_at"))
             .join(Event).where(Delivery.subscription == subscription_id)
             .order_by(Event.created_at.desc(), Event.id.desc()).limit(limit))
    if state:
        query = query.where(Delivery.state == state)
    return [DeliveryRow(event_id, kind, state, attempts, created_at,
                        finished_at if state == Delivery.DEAD else due_at)
            for event_id, kind, state, attempts, created_at, due_at, finished_at in query.tuples()]


def replay_dead_letters(subscription_id: str, now_ms: int, since_ms: int | None = None,
                        event_id: str | None = None) -> int:
    """Queue the subscription's dead-lettered deliveries again, due now, with a fresh set of attempts.
    The events keep their id and body bytes. Refused while the subscription is disabled. Returns how
    many were queued; `since_ms` keeps events that occurred at or after it, `event_id` one event."""
    with write_transaction():
        subscription = _find(subscription_id, lock=True)
        if not subscription.active:
            raise OperatorError(f"Subscription {subscription_id} is disabled: enable it first "
                                f"(flask webhooks enable {subscription_id}).")
        events = Event.select(Event.id).where(Event.subscription == subscription_id)
        if since_ms is not None:
            events = events.where(Event.created_at >= since_ms)
        if event_id is not None:
            events = events.where(Event.id == event_id)
        return (Delivery.update(state=Delivery.PENDING, attempts=0, due_at=now_ms, lease_token=None)
                .where((Delivery.subscription == subscription_id) & (Delivery.state == Delivery.DEAD)
                       & Delivery.event.in_(events))
                .execute())


def _find(subscription_id: str, lock: bool = False) -> Subscription:
    query = Subscription.select().where(Subscription.id == subscription_id)
    if lock and not is_sqlite():
        query = query.for_update()  # an auto-disable of this subscription waits for the replay
    subscription = query.first()
    if subscription is None:
        raise OperatorError(f"No subscription {subscription_id!r}.")
    return subscription
