"""Events into the delivery queue, and the failures audit out of it: what a partner's request
does to the outbox (partner/outbox.py claims, partner/outcomes.py records)."""

import hmac
import uuid

from peewee import Tuple

from models import SQL_CONDITIONS, Delivery, Event, Failure, Subscription
from partner.store.sql import page_of, run_sql, write_transaction
from partner.envelopes import compact
from partner.errors import ApiError
from partner.subscriptions import find_subscription

TEST_PING = "vc.test.ping"

# Run by database.run_sql, as the outbox's hand-written statements are: a ping's delivery comes
# after every open one of its subscription (seq, the enqueue order).
_ENQUEUE = ('INSERT INTO delivery (event_id, subscription_id, state, due_at, seq) VALUES ({p}, {p}, {p}, {p}, '
            '(SELECT COALESCE(MAX(seq), 0) + 1 FROM delivery WHERE subscription_id = {p} AND {open}))')


def trigger_test_ping(org_id: str, subscription_id: str, secret: str, key_id: str,
                      now_ms: int) -> Event:
    """The partner's test trigger: 404 unless the organization has the subscription, 403 unless
    `secret` is its secret, 409 once it is disabled, else a vc.test.ping queued. One transaction,
    holding the subscription, so a delete or an auto-disable cannot commit between the check and the
    enqueue. A secret this process cannot open raises SealingError (503: edge/problems.py)."""
    with write_transaction():
        subscription = find_subscription(org_id, subscription_id, lock=True)
        if not hmac.compare_digest(secret.encode(), subscription.secret.encode()):
            raise ApiError(403, "secret_mismatch", "The secret does not match this subscription's.")
        if not subscription.active:
            raise ApiError(409, "subscription_disabled",
                           f"The subscription was auto-disabled after repeated failures. Fix your endpoint, then "
                           f"ask the service's operator to re-enable it (flask webhooks enable {subscription.id}), "
                           f"or delete it and create a new one.")
        return enqueue_test_ping(subscription, key_id, now_ms)


def enqueue_test_ping(subscription: Subscription, key_id: str, now_ms: int) -> Event:
    """Create a vc.test.ping for the subscription, due at once; committed before the caller answers,
    so an accepted request survives a crash."""
    data = {"message": "This is a test ping from the Partner Integration Service.",
            "triggered_by_key_id": key_id}
    event_id = f"evt_{uuid.uuid4()}"
    with write_transaction():
        event = Event.create(id=event_id, kind=TEST_PING, created_at=now_ms, occurred_at=now_ms, data=compact(data))
        run_sql(_ENQUEUE, (event_id, subscription.id, Delivery.PENDING, now_ms, subscription.id), **SQL_CONDITIONS)
    return event


def failures_page(subscription: Subscription, position: list | None, limit: int):
    """A page of the subscription's failure records, newest first, and the next position."""
    query = Failure.select(Failure, Event.kind).join(Event).where(Failure.subscription == subscription)
    if position is not None:
        query = query.where(Tuple(Failure.attempted_at, Failure.id) < tuple(position))
    # Plain rows: building a peewee model per row cost most of a list request's CPU (bench/api_overhead).
    rows = list(query.order_by(Failure.attempted_at.desc(), Failure.id.desc()).limit(limit + 1).dicts().iterator())
    return page_of(rows, limit, ["attempted_at", "id"])
