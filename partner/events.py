"""Events into the delivery queue, and the failures audit out of it: what a partner's request or a
publisher's event does to the outbox (partner/outbox.py claims, partner/outcomes.py records)."""

import hmac
import threading
import uuid

from peewee import Tuple

from models import Delivery, Event, Failure, Subscription
from partner.store.sql import page_of, run_sql, write_transaction
from partner.envelopes import compact
from partner.errors import ApiError
from partner.subscriptions import find_subscription, secret_of

TEST_PING = "vc.test.ping"

# Rows written in bulk, a chunk per statement: a 500-event batch fanned out to 100 subscriptions is
# 50,000 deliveries, and one statement per row cost ~5 times as much (bench/ingest.py).
_EVENTS = "INSERT INTO event (id, kind, occurred_at, data, created_at) VALUES :rows"
_DELIVERIES = "INSERT INTO delivery (event_id, subscription_id, state, due_at, seq) VALUES :rows"
CHUNK = 500  # rows per statement: 2,500 parameters, under every SQLite's limit
# The enqueue order (claims.py: a subscription's deliveries due together go in `seq` order): the clock
# in ms, shifted to leave room for the deliveries queued within one ms, and never lower than the last
# given by this process (SQLite's one process writes in turn, so its order is total; on PostgreSQL
# enqueues committing at the same moment in two services were not ordered anyway). Above every seq
# of the releases before (at most a creation time in ms), so an old backlog keeps its place.
_SEQ_SHIFT = 20
_last_seq = 0
_seq_lock = threading.Lock()


def trigger_test_ping(org_id: str, subscription_id: str, secret: str, key_id: str,
                      now_ms: int) -> Event:
    """The partner's test trigger: 404 unless the organization has the subscription, 403 unless
    `secret` is its secret, 409 once it is disabled, else a vc.test.ping queued. One transaction,
    holding the subscription, so a delete or an auto-disable cannot commit between the check and the
    enqueue. A secret this process cannot open raises SealingError (503: edge/problems.py)."""
    with write_transaction():
        subscription = find_subscription(org_id, subscription_id, lock=True)
        if not hmac.compare_digest(secret.encode(), secret_of(subscription).encode()):
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
    event = Event(id=new_event_id(), kind=TEST_PING, created_at=now_ms, occurred_at=now_ms, data=compact(data))
    with write_transaction():
        queue_events([(event, [subscription.id])], now_ms)
    return event


def new_event_id() -> str:
    return f"evt_{uuid.uuid4()}"


def queue_events(fanned: list[tuple[Event, list[str]]], now_ms: int) -> None:
    """Store each event once with a delivery to each of its subscriptions, due now, after every delivery
    the subscription already has (seq). Events without a subscription are not stored. Call inside a
    write transaction: the caller's answer says they are queued."""
    fanned = [(event, subscription_ids) for event, subscription_ids in fanned if subscription_ids]
    first = _seqs(now_ms, len(fanned))
    events = [(e.id, e.kind, e.occurred_at, e.data, e.created_at) for e, _ in fanned]
    deliveries = [(event.id, subscription_id, Delivery.PENDING, now_ms, first + n)
                  for n, (event, subscription_ids) in enumerate(fanned) for subscription_id in subscription_ids]
    _insert(_EVENTS, events)
    _insert(_DELIVERIES, deliveries)


def _seqs(now_ms: int, count: int) -> int:
    """The first of `count` enqueue-order numbers, one per event (_SEQ_SHIFT)."""
    global _last_seq
    with _seq_lock:
        first = max(now_ms << _SEQ_SHIFT, _last_seq + 1)
        _last_seq = first + count - 1
    return first


def _insert(template: str, rows: list[tuple]) -> None:
    for start in range(0, len(rows), CHUNK):
        run_sql(template, {"rows": rows[start:start + CHUNK]})


def failures_page(subscription: Subscription, position: list | None, limit: int):
    """A page of the subscription's failure records, newest first, and the next position."""
    query = Failure.select(Failure, Event.kind).join(Event).where(Failure.subscription == subscription)
    if position is not None:
        query = query.where(Tuple(Failure.attempted_at, Failure.id) < tuple(position))
    # Plain rows: building a peewee model per row cost most of a list request's CPU (bench/api_overhead).
    rows = list(query.order_by(Failure.attempted_at.desc(), Failure.id.desc()).limit(limit + 1).dicts().iterator())
    return page_of(rows, limit, ["attempted_at", "id"])
