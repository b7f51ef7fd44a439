"""One published event, many deliveries (CONTRACT §11): a delivery is (event id, subscription id), and
what happens to one subscription's delivery never touches another's, end to end with real receivers
on 127.0.0.1 and the queue stepped (dispatcher.run_due)."""

import json
from collections import Counter

import pytest

import signing
from models import Delivery, Event, db
from partner.outbound.transport import AttemptResult
from partner.outbox import claim_due
from partner.retention import prune, purge_deleted
from partner.retry import RetryPolicy
from tests.support import WEBHOOKS, json_of, lead, record_attempt

pytestmark = [pytest.mark.both_databases,
              pytest.mark.config(WEBHOOK_ALLOWED_NETWORKS=["127.0.0.0/8"], DELIVERY_RETRY_DELAYS=[60])]


POLICY = RetryPolicy([60], 20)


@pytest.fixture
def two(start_receiver, subscribe):
    """Two subscriptions of one organization, each with its own receiver: (subscription, receiver) pairs."""
    receivers = [start_receiver(), start_receiver()]
    return [(subscribe(receiver.url), receiver) for receiver in receivers]


def states(app, event_id: str) -> dict[str, tuple[str, int]]:
    with app.app_context(), db.connection_context():
        return {d.subscription_id: (d.state, d.attempts) for d in Delivery.select().where(Delivery.event == event_id)}


def test_each_subscription_receives_the_same_event_in_its_own_signed_envelope(dispatcher, two, publish, clock):
    event_id = json_of(publish(lead(data={"lead_id": "ld_1", "name": "Zoë"})), 202)["id"]
    assert dispatcher.run_due() == 2
    for subscription, receiver in two:
        [request] = receiver.received
        signing.verify(request.headers, request.body, subscription["secret"], now_ms=int(clock() * 1000))
        assert json.loads(request.body) == {"event": "lead.created", "id": event_id, "subscription_id": subscription["id"],
                                            "occurred_at": json.loads(request.body)["occurred_at"],
                                            "data": {"lead_id": "ld_1", "name": "Zoë"}}
        assert (request.headers["X-VC-Event"], request.headers["X-VC-Event-Id"]) == ("lead.created", event_id)


def test_one_sibling_succeeding_leaves_the_failing_one_to_its_retries(app, dispatcher, two, publish, clock, client, auth):
    (ok, _), (failing, receiver) = two
    receiver.script = [500, 200]
    event_id = json_of(publish(lead()), 202)["id"]
    assert dispatcher.run_due() == 2
    assert states(app, event_id) == {ok["id"]: ("delivered", 1), failing["id"]: ("pending", 1)}
    audit = {s["id"]: client.get(f"{WEBHOOKS}/{s['id']}/failures", headers=auth).get_json()["data"] for s in (ok, failing)}
    assert audit[ok["id"]] == [] and [(f["event_id"], f["event"]) for f in audit[failing["id"]]] == [(event_id, "lead.created")]
    clock.advance(70)
    assert dispatcher.run_due() == 1
    assert states(app, event_id) == {ok["id"]: ("delivered", 1), failing["id"]: ("delivered", 2)}
    assert [len(r.received) for _, r in two] == [1, 2]
    assert len({r.body for r in receiver.received}) == 1  # every attempt of a delivery sends the same bytes


def test_deleting_one_subscription_keeps_the_others_delivery_and_the_event(app, dispatcher, two, publish, client, auth):
    (kept, receiver), (gone, _) = two
    event_id = json_of(publish(lead()), 202)["id"]
    assert client.delete(f"{WEBHOOKS}/{gone['id']}", headers=auth).status_code == 204
    with app.app_context(), db.connection_context():
        assert purge_deleted() == 1
        assert Event.select().count() == 1
    assert dispatcher.run_due() == 1
    assert states(app, event_id) == {kept["id"]: ("delivered", 1)} and len(receiver.received) == 1


def test_retention_removes_an_event_with_its_last_delivery(app, dispatcher, two, publish, clock):
    (first, receiver), (second, _) = two
    receiver.script = [500]
    event_id = json_of(publish(lead()), 202)["id"]
    dispatcher.run_due()  # one delivered, one pending a retry
    with app.app_context(), db.connection_context():
        pruned = prune(int(clock() * 1000) + 1)
        assert (pruned.deliveries, pruned.events, Event.select().count()) == (1, 0, 1)
    assert states(app, event_id) == {first["id"]: ("pending", 1)}


def test_replaying_one_siblings_dead_letter_sends_it_alone_the_same_bytes(app, dispatcher, two, publish, clock):
    (dead, receiver), (delivered, other) = two
    receiver.script = [500, 500, 200]
    event_id = json_of(publish(lead()), 202)["id"]
    dispatcher.run_due()
    clock.advance(70)
    dispatcher.run_due()
    assert states(app, event_id) == {dead["id"]: ("dead", 2), delivered["id"]: ("delivered", 1)}
    result = app.test_cli_runner().invoke(args=["deliveries", "replay", "--subscription", dead["id"], "--event", event_id])
    assert result.exit_code == 0 and "Queued 1 " in result.output
    clock.advance(5)  # past the backoff its last failure holds the subscription for
    assert dispatcher.run_due() == 1
    assert states(app, event_id) == {dead["id"]: ("delivered", 1), delivered["id"]: ("delivered", 1)}
    assert len({r.body for r in receiver.received}) == 1 and len(other.received) == 1


def test_deliveries_show_tells_each_subscriptions_story_or_the_one_asked_for(app, dispatcher, two, publish):
    (failing, receiver), (ok, _) = two
    receiver.script = [500]
    event_id = json_of(publish(lead()), 202)["id"]
    dispatcher.run_due()
    runner = app.test_cli_runner()
    both = runner.invoke(args=["deliveries", "show", event_id])
    assert both.exit_code == 0, both.output
    assert both.output.count(f"event:        {event_id}") == 2
    assert f"subscription: {failing['id']} (active)" in both.output and f"subscription: {ok['id']} (active)" in both.output
    one = runner.invoke(args=["deliveries", "show", event_id, "--subscription", ok["id"]])
    assert one.output.count("event: ") == 1 and "delivered on attempt 1" in one.output and "kind:         lead.created" in one.output


def test_siblings_claimed_together_are_recorded_apart(app, two, publish, clock):
    """One claim takes both deliveries under one lease token: each outcome still names its own."""
    (ok, _), (failing, _) = two
    event_id = json_of(publish(lead()), 202)["id"]
    now = int(clock() * 1000)
    with app.app_context(), db.connection_context():
        claims = {claim.subscription_id: claim for claim in claim_due(now, 8, 60_000)}
        assert len({claim.lease_token for claim in claims.values()}) == 1
        record_attempt(claims[ok["id"]], AttemptResult(True, 200, None, "", 1), now, now, POLICY, 0)
        record_attempt(claims[failing["id"]], AttemptResult(False, 500, "http_status", "", 1), now, now, POLICY, 0)
    assert states(app, event_id) == {ok["id"]: ("delivered", 1), failing["id"]: ("pending", 1)}


# --- a failing endpoint is held, not hammered (partner/concurrency.py) ------------------------------

def test_a_receiver_down_for_3_s_under_100_events_a_second_loses_nothing(app, dispatcher, start_receiver, subscribe,
                                                                        publish, clock, client, auth):
    receiver = start_receiver(script=[500])
    subscription = subscribe(receiver.url)
    published = []
    for _ in range(300):  # 100 events a second for 3 s, the receiver failing every attempt
        published.append(json_of(publish(lead()), 202)["id"])
        dispatcher.run_due()
        clock.advance(0.01)
    failed_during = len(receiver.received)
    receiver.script = [200]
    for _ in range(300):  # it is back: every retry falls due within the schedule's first delay
        dispatcher.run_due()
        clock.advance(1)
    [listed] = client.get(WEBHOOKS, headers=auth).get_json()["data"]
    assert (listed["active"], listed["consecutive_failures"]) == (True, 0)
    delivered = Counter(json.loads(r.body)["id"] for r in receiver.received[failed_during:])  # each answered 200
    assert sorted(delivered) == sorted(published) and set(delivered.values()) == {1}
    with app.app_context(), db.connection_context():
        assert Delivery.select().where(Delivery.state != Delivery.DELIVERED).count() == 0  # nothing dead-lettered
    assert failed_during < 10  # two unheld, then one probe per backoff: 1 + 2 s of holds within the 3 s


def test_a_receiver_down_for_good_is_still_auto_disabled_after_20_failures_in_a_row(app, dispatcher, start_receiver,
                                                                                   subscribe, publish, clock, client,
                                                                                   auth):
    receiver = start_receiver(script=[500])
    subscribe(receiver.url)
    started = clock()
    for _ in range(40):  # an event every 30 s, each attempt held by the growing backoff
        publish(lead())
        for _ in range(30):
            dispatcher.run_due()
            clock.advance(1)
    [listed] = client.get(WEBHOOKS, headers=auth).get_json()["data"]
    assert (listed["active"], listed["consecutive_failures"]) == (False, 20)
    assert len(receiver.received) == 20
    assert clock() - started > 10 * 60  # not within the first minute of failing, as unheld it would be
