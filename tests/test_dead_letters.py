"""Auto-disables and dead letters are events the operator sees (docs/operations.md): one WARNING line
each, every dead letter counted once in partner_deliveries_dead_lettered_total, and no failure record
promising an attempt that will not come."""

import logging

import pytest
from prometheus_client import REGISTRY

from models import Delivery, Subscription
from partner.events import enqueue_test_ping
from partner.keys import create_key
from partner.claims import MAX_UNRECORDED, Claim
from partner.outbox import claim_due
from partner.outbound.transport import AttemptResult
from partner.retry import RetryPolicy
from partner.subscriptions import create_subscription
from tests.support import WEBHOOKS, delivery_of, json_of, record_attempt, run_through_backoffs

THRESHOLD = 3
NOW = 1_800_000_000_000
LEASE = 40_000


def dead_lettered() -> float:
    return REGISTRY.get_sample_value("partner_deliveries_dead_lettered_total")


def warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "delivery" and r.levelno == logging.WARNING]


@pytest.mark.both_databases
@pytest.mark.config(WEBHOOK_ALLOWED_NETWORKS=["127.0.0.0/8"], AUTO_DISABLE_THRESHOLD=THRESHOLD)
def test_an_auto_disable_with_five_pending_deliveries_is_one_line_six_dead_letters_and_no_promise(
        app, start_receiver, subscribe, ping, failures, caplog, clock):
    subscription = subscribe(start_receiver(script=[500]).url)
    events = [json_of(ping(subscription), 202)["id"] for _ in range(6)]
    before = dead_lettered()
    caplog.set_level(logging.INFO, logger="delivery")
    # Events 1 and 2 fail and wait for their retry; event 3's failure, after their backoffs, is the third in a row.
    assert run_through_backoffs(app.extensions["delivery"], clock) == THRESHOLD
    [line] = warnings(caplog)
    assert line == (f"auto-disabled subscription={subscription['id']} organization=acme threshold={THRESHOLD} "
                    f"event={events[2]} dead_lettered=6 (the failing delivery and 5 open ones); "
                    f"`flask webhooks enable {subscription['id']}` re-enables it")
    with app.app_context():
        assert [delivery_of(event).state for event in events] == ["dead"] * 6
    assert dead_lettered() == before + 6
    records = failures(subscription)["data"]
    assert sorted(record["event_id"] for record in records) == sorted(events[:3])
    assert [record["next_attempt_at"] for record in records] == [None] * 3


@pytest.mark.config(WEBHOOK_ALLOWED_NETWORKS=["127.0.0.0/8"], DELIVERY_RETRY_DELAYS=[])
def test_a_dead_letter_is_one_line_naming_it_and_counted_once(app, start_receiver, subscribe, ping, caplog):
    subscription = subscribe(start_receiver(script=[500]).url)
    event = json_of(ping(subscription), 202)["id"]
    before = dead_lettered()
    caplog.set_level(logging.INFO, logger="delivery")
    assert app.extensions["delivery"].run_due() == 1
    assert warnings(caplog) == [
        f"dead-lettered event={event} subscription={subscription['id']} organization=acme attempts=1 "
        f"reason=retries_exhausted; `flask deliveries show {event}` says why"]
    assert dead_lettered() == before + 1


# --- the settlements that make no attempt, and an attempt under way when its subscription is disabled ---

@pytest.fixture
def subscription(database):
    org = create_key("acme", ["webhooks:manage"], NOW).key.organization
    return create_subscription(org.id, "http://93.184.215.14/hook", None, NOW)


def failed(claim, policy=RetryPolicy([60], THRESHOLD)):
    result = AttemptResult(False, 500, "http_status", "", 5)
    return record_attempt(claim, result, NOW + 10, NOW + 15, policy, jitter=0)


def test_an_attempt_swept_while_under_way_is_counted_once_when_it_fails(subscription, caplog):
    enqueue_test_ping(subscription, "KEYID", NOW)
    swept = enqueue_test_ping(subscription, "KEYID", NOW + 1)
    [failing] = claim_due(NOW + 5, 10, LEASE)  # the oldest
    # Another process holds the other delivery: claimed there, its attempt under way.
    (Delivery.update(state=Delivery.IN_FLIGHT, due_at=NOW + LEASE, lease_token="elsewhere")
     .where(Delivery.event == swept.id).execute())
    under_way = Claim(swept.id, "vc.test.ping", b"{}", 1, "elsewhere", subscription.id, subscription.organization_id,
                      subscription.url, "whsec_x")
    Subscription.update(consecutive_failures=THRESHOLD - 1).where(Subscription.id == subscription.id).execute()
    before = dead_lettered()
    caplog.set_level(logging.INFO, logger="delivery")
    assert failed(failing).auto_disabled
    assert dead_lettered() == before + 2
    assert failed(under_way).dead_lettered  # recorded: its lease was kept
    assert dead_lettered() == before + 2
    assert len(warnings(caplog)) == 1


def test_a_delivery_found_queued_for_a_disabled_subscription_is_a_dead_letter_line(subscription, caplog):
    queued = [enqueue_test_ping(subscription, "KEYID", NOW + offset) for offset in (0, 1)]
    Subscription.update(active=False, auto_disabled_at=NOW).where(Subscription.id == subscription.id).execute()
    before = dead_lettered()
    caplog.set_level(logging.INFO, logger="delivery")
    assert claim_due(NOW + 10, 10, LEASE) == []
    assert warnings(caplog) == [
        f"dead-lettered event={event.id} subscription={subscription.id} organization=acme attempts=0 "
        f"reason=subscription_disabled; `flask deliveries show {event.id}` says why" for event in queued]
    assert dead_lettered() == before + 2


def test_a_delivery_never_recorded_is_a_dead_letter_line(subscription, caplog):
    event = enqueue_test_ping(subscription, "KEYID", NOW)
    Delivery.update(unrecorded=MAX_UNRECORDED).where(Delivery.event == event.id).execute()
    before = dead_lettered()
    caplog.set_level(logging.INFO, logger="delivery")
    assert claim_due(NOW + 10, 10, LEASE) == []
    assert warnings(caplog) == [
        f"dead-lettered event={event.id} subscription={subscription.id} organization=acme attempts=1 "
        f"reason=not_recorded; `flask deliveries show {event.id}` says why"]
    assert dead_lettered() == before + 1
