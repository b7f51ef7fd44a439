"""What the operator does to a subscription's deliveries (`flask deliveries`): list them, replay
dead letters."""

from dataclasses import dataclass

from peewee import fn

from models import Delivery, Event, Failure, Subscription
from partner.store.sql import is_sqlite, write_transaction
from partner.errors import OperatorError
from partner.subscriptions import LIVE

STATES = (Delivery.PENDING, Delivery.IN_FLIGHT, Delivery.DELIVERED, Delivery.DEAD)


@dataclass(frozen=True)
class DeliveryRow:
    event_id: str
    kind: str
    state: str
    attempts: int
    created_at: int
    # Open: when it is next due. Dead: when its last attempt ended. Delivered: not recorded (None).
    due_or_finished_at: int | None


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
    """Queue the subscription's dead-lettered deliveries again, due now, with a fresh set of attempts
    (unrecorded ones included: one dead-lettered `not_recorded` is sent again, not dead at once). The
    events keep their id and body bytes. Refused while the subscription is disabled. Returns how many
    were queued; `since_ms` keeps events that occurred at or after it, `event_id` one event."""
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
        return (Delivery.update(state=Delivery.PENDING, attempts=0, unrecorded=0, due_at=now_ms, lease_token=None)
                .where((Delivery.subscription == subscription_id) & (Delivery.state == Delivery.DEAD)
                       & Delivery.event.in_(events))
                .execute())


def _find(subscription_id: str, lock: bool = False) -> Subscription:
    query = Subscription.select().where((Subscription.id == subscription_id) & LIVE)
    if lock and not is_sqlite():
        query = query.for_update()  # an auto-disable of this subscription waits for the replay
    subscription = query.first()
    if subscription is None:
        raise OperatorError(f"No subscription {subscription_id!r}.")
    return subscription
