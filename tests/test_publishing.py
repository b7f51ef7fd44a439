"""Publishing platform events (CONTRACT §11): publishers and partners never share credentials, each
event is checked against the registry and fanned out to the organization's matching subscriptions,
a batch is all or nothing, every refusal stores nothing, and an Idempotency-Key queues once."""

import json
import time

import pytest

from models import Delivery, Event, IdempotencyKey, Subscription, db
from partner import idempotency
from partner.event_types import retire_event_type
from partner.publishers import create_publisher, revoke_publisher
from tests.support import BATCH, EVENTS, WEBHOOKS, assert_problem, bearer, field_codes, json_of, lead

URL = "https://hooks.partner.example/events"


def stored(app) -> tuple[int, list[tuple[str, str]]]:
    """How many events are stored, and every delivery as (event id, subscription id)."""
    with app.app_context(), db.connection_context():
        return Event.select().count(), sorted((d.event_id, d.subscription_id) for d in Delivery.select())


@pytest.fixture
def subscribe_to(client, auth):
    def subscribe_to(events=None, headers=auth) -> dict:
        body = {"url": URL} if events == "absent" else {"url": URL, "events": events}
        return json_of(client.post(WEBHOOKS, json=body, headers=headers), 201)
    return subscribe_to


# --- credentials ---------------------------------------------------------------------------------

def test_a_publish_without_a_credential_is_refused(client, registered):
    assert_problem(client.post(EVENTS, json=lead()), 401, "unauthorized")


def test_a_partner_key_cannot_publish_and_a_publisher_cannot_call_the_partner_api(client, api_key, credential):
    assert_problem(client.post(EVENTS, json=lead(), headers=bearer(api_key)), 401, "unauthorized")
    assert_problem(client.get("/api/v1/partner/me", headers=bearer(credential)), 401, "unauthorized")


def test_a_revoked_publisher_is_refused(app, clock, publish, credential):
    publisher_id = credential.removeprefix("vcp_").split(".")[0]
    with app.app_context(), db.connection_context():
        revoke_publisher(publisher_id, int(clock() * 1000))
    assert_problem(publish(lead()), 401, "unauthorized")


def test_a_wrong_secret_is_refused(publish, credential):
    assert_problem(publish(lead(), credential=credential[:-4] + "AAAA"), 401, "unauthorized")


def test_publishing_never_spends_an_organization_budget(client, auth, publish, subscribe_to):
    subscribe_to()
    before = client.get("/api/v1/partner/me", headers=auth).get_json()["rate_limit_remaining"]
    for _ in range(5):
        assert publish(lead()).status_code == 202
    assert client.get("/api/v1/partner/me", headers=auth).get_json()["rate_limit_remaining"] == before - 1


# --- fan-out ---------------------------------------------------------------------------------------

def test_one_event_is_stored_once_with_a_delivery_to_each_matching_subscription(app, publish, subscribe_to):
    every, leads, exact, intakes = subscribe_to(), subscribe_to(["lead.*"]), subscribe_to(["lead.created"]), \
        subscribe_to(["intake.*"])
    answer = json_of(publish(lead(occurred_at="2026-12-05T10:00:00Z")), 202)
    assert answer == {"id": answer["id"], "event": "lead.created", "organization": "acme",
                      "occurred_at": "2026-12-05T10:00:00.000Z", "subscriptions": 3}
    assert stored(app) == (1, sorted((answer["id"], s["id"]) for s in (every, leads, exact)))
    assert intakes["events"] == ["intake.*"] and every["events"] is None


def test_a_family_wildcard_matches_at_any_depth(app, publish, subscribe_to):
    leads = subscribe_to(["lead.*"])
    answer = json_of(publish({**lead(), "event": "lead.note.added", "data": {}}), 202)
    assert stored(app)[1] == [(answer["id"], leads["id"])]


def test_an_organization_without_subscriptions_or_unknown_gets_202_and_nothing_is_stored(app, publish, subscribe_to):
    subscribe_to()
    assert json_of(publish(lead(org="nobody")), 202)["subscriptions"] == 0
    assert stored(app) == (0, [])


def test_disabled_and_deleted_subscriptions_get_nothing(app, client, auth, publish, subscribe_to):
    live, disabled, deleted = subscribe_to(), subscribe_to(), subscribe_to()
    with app.app_context(), db.connection_context():
        Subscription.update(active=False).where(Subscription.id == disabled["id"]).execute()
    assert client.delete(f"{WEBHOOKS}/{deleted['id']}", headers=auth).status_code == 204
    answer = json_of(publish(lead()), 202)
    assert (answer["subscriptions"], stored(app)[1]) == (1, [(answer["id"], live["id"])])


def test_another_organization_never_receives_the_event(app, issue_key, publish, subscribe_to):
    subscribe_to(headers=bearer(issue_key("globex")))
    assert json_of(publish(lead()), 202)["subscriptions"] == 0


def test_a_filter_naming_a_retired_type_is_kept_and_matches_nothing_new(app, clock, publish, subscribe_to, client, auth):
    subscription = subscribe_to(["lead.created"])
    with app.app_context(), db.connection_context():
        retire_event_type("lead.created", int(clock() * 1000))
    assert client.get(WEBHOOKS, headers=auth).get_json()["data"][0]["events"] == ["lead.created"]
    assert_problem(publish(lead()), 422, "validation_error")
    assert subscription["events"] == ["lead.created"]


# --- refusals store nothing -----------------------------------------------------------------------

@pytest.mark.both_databases
@pytest.mark.parametrize("body, expected", [
    ({**lead(), "extra": 1}, [("extra", "unknown_field")]),
    ({"event": "lead.created", "data": {}}, [("organization", "required")]),  # the type is checked on a whole event
    (lead(event="lead.unknown"), [("event", "unknown_event_type")]),
    (lead(event="vc.test.ping"), [("event", "reserved_event_type")]),
    (lead(data={"lead_id": 7}), [("data/lead_id", "schema_mismatch")]),
    (lead(data=[1]), [("data", "invalid_type")]),
    (lead(data=None), [("data", "required")]),
    (lead(occurred_at="yesterday"), [("occurred_at", "invalid_type")]),
    (lead(organization=3), [("organization", "invalid_type")]),
    (lead(org="ac\u0000me"), [("organization", "invalid_type")]),  # PostgreSQL refuses NUL in a query
    (lead(org="Acme"), [("organization", "invalid_type")]),
])
def test_an_invalid_event_is_refused_naming_its_fields_and_nothing_is_stored(app, publish, subscribe_to, body, expected):
    subscribe_to()
    response = publish(body)
    assert_problem(response, 422, "validation_error")
    assert field_codes(response) == expected
    assert stored(app) == (0, [])


def test_a_schema_mismatch_says_what_the_schema_wanted(publish):
    [error] = publish(lead(data={"lead_id": 7})).get_json()["errors"]
    assert error == {"field": "data/lead_id", "code": "schema_mismatch", "message": "7 is not of type 'string'"}


def test_a_retired_type_is_refused(app, clock, publish):
    with app.app_context(), db.connection_context():
        retire_event_type("lead.created", int(clock() * 1000))
    assert field_codes(publish(lead())) == [("event", "retired_event_type")]


def test_a_body_that_is_not_json_is_refused(client, credential):
    response = client.post(EVENTS, data=b"{", headers={**bearer(credential), "Content-Type": "application/json"})
    assert_problem(response, 400, "invalid_json")


def test_an_event_over_256_kib_is_refused(app, publish, subscribe_to):
    subscribe_to()
    assert_problem(publish(lead(data={"lead_id": "x" * 262_144})), 413, "payload_too_large")
    assert stored(app) == (0, [])


@pytest.mark.config(BACKLOG_LIMIT=2)
def test_an_organization_over_its_backlog_is_refused_and_another_is_not(app, issue_key, publish, subscribe_to):
    subscribe_to(), subscribe_to()
    subscribe_to(headers=bearer(issue_key("globex")))
    assert publish(lead()).status_code == 202  # 2 pending: not over
    assert publish(lead()).status_code == 202  # the backlog is counted before: 2 is not more than 2
    response = publish(lead())
    assert_problem(response, 503, "backlog_full")
    assert int(response.headers["Retry-After"]) > 0
    assert stored(app)[0] == 2
    assert publish(lead(org="globex")).status_code == 202


# --- batches ----------------------------------------------------------------------------------------

def test_a_batch_answers_each_event_in_order(app, publish, subscribe_to):
    subscribe_to(["lead.*"])
    answer = json_of(publish({"events": [lead(), {**lead(), "event": "lead.note.added"}, lead(org="x")]}, path=BATCH), 202)
    assert [(e["event"], e["subscriptions"]) for e in answer["data"]] == [
        ("lead.created", 1), ("lead.note.added", 1), ("lead.created", 0)]
    assert stored(app)[0] == 2


def test_a_batch_with_one_invalid_event_stores_nothing_and_names_each_invalid_one(app, publish, subscribe_to):
    subscribe_to()
    response = publish({"events": [lead(), lead(event="nope"), lead(), lead(data={"lead_id": 1})]}, path=BATCH)
    assert field_codes(response) == [("events/1/event", "unknown_event_type"), ("events/3/data/lead_id", "schema_mismatch")]
    assert stored(app) == (0, [])


@pytest.mark.parametrize("body, code", [({"events": []}, "out_of_range"), ({"events": [lead()] * 501}, "out_of_range"),
                                        ({}, "required"), ({"events": {}}, "invalid_type")])
def test_a_batch_holds_1_to_500_events(publish, body, code):
    assert field_codes(publish(body, path=BATCH)) == [("events", code)]


# --- idempotency ------------------------------------------------------------------------------------

def test_the_same_key_and_body_again_gets_the_first_answer_and_queues_nothing(app, publish, subscribe_to):
    subscribe_to()
    first = publish(lead(), key="order-1")
    again = publish(json.loads(json.dumps(dict(reversed(list(lead().items()))))), key="order-1")  # key order differs
    assert (first.status_code, again.status_code, again.headers["Idempotent-Replayed"]) == (202, 200, "true")
    assert again.get_json() == first.get_json()
    assert stored(app)[0] == 1


def test_the_same_key_with_another_body_is_a_conflict(app, publish, subscribe_to):
    subscribe_to()
    publish(lead(), key="order-1")
    assert_problem(publish(lead(data={"lead_id": "ld_2"}), key="order-1"), 409, "idempotency_conflict")
    assert stored(app)[0] == 1


def test_a_key_being_answered_is_in_progress(app, clock, publish, credential):
    publisher_id = credential.removeprefix("vcp_").split(".")[0]
    with app.app_context(), db.connection_context():
        idempotency.reserve(publisher_id, "order-1", idempotency.request_hash(lead()), int(clock() * 1000))
    response = publish(lead(), key="order-1")
    assert_problem(response, 409, "idempotency_in_progress")
    assert response.headers["Retry-After"] == "1"


def test_a_refused_request_gives_its_key_back(app, publish, subscribe_to):
    subscribe_to()
    assert publish(lead(event="nope"), key="order-1").status_code == 422
    assert publish(lead(), key="order-1").status_code == 202


def test_keys_are_per_publisher_and_remembered_for_a_match_of_nothing(app, clock, publish):
    with app.app_context(), db.connection_context():
        other = create_publisher("crm", int(clock() * 1000)).credential
    assert json_of(publish(lead(), key="k"), 202)["subscriptions"] == 0
    assert publish(lead(), key="k").status_code == 200
    assert publish(lead(), key="k", credential=other).status_code == 202
    with app.app_context(), db.connection_context():
        assert IdempotencyKey.select().count() == 2


@pytest.mark.parametrize("key", ["", "x" * 256, "caf\u00e9"])
def test_an_idempotency_key_is_1_to_255_printable_ascii(publish, key):
    assert_problem(publish(lead(), key=key), 400, "invalid_idempotency_key")


def test_a_key_older_than_24_hours_is_forgotten(app, clock, publish, subscribe_to):
    subscribe_to()
    publish(lead(), key="k")
    clock.advance(24 * 3600 + 1)
    assert publish(lead(), key="k").status_code == 202
    assert stored(app)[0] == 2


# --- ports ------------------------------------------------------------------------------------------

@pytest.mark.config(OPS_PORT=9100)
def test_with_an_ops_port_publishing_answers_there_only(client, credential, registered):
    headers = bearer(credential)
    assert_problem(client.post(EVENTS, json=lead(), headers=headers), 404, "not_found")
    assert client.post(EVENTS, json=lead(), headers=headers, base_url="http://localhost:9100").status_code == 202


# --- metrics ------------------------------------------------------------------------------------------

@pytest.mark.config(WEBHOOK_ALLOWED_NETWORKS=["127.0.0.0/8"])
def test_the_metrics_count_published_events_their_fan_out_and_the_lag(client, publish, subscribe, receiver, dispatcher,
                                                                        clock):
    def sample(text: str, name: str) -> float:
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))
    before = client.get("/metrics").text
    subscribe(receiver.url), subscribe(receiver.url)
    publish({"events": [lead(), lead(org="nobody")]}, path=BATCH)
    clock.advance(0.25)
    dispatcher.run_due()
    after = client.get("/metrics").text
    assert sample(after, 'partner_events_published_total{event="lead.created"}') - \
        sample(before, 'partner_events_published_total{event="lead.created"}') == 2
    assert sample(after, "partner_event_fanout_sum") - sample(before, "partner_event_fanout_sum") == 2
    assert sample(after, "partner_delivery_lag_seconds_count") - sample(before, "partner_delivery_lag_seconds_count") == 2
    assert sample(after, "partner_delivery_lag_seconds_sum") - sample(before, "partner_delivery_lag_seconds_sum") == 0.5


def test_a_pattern_that_would_backtrack_for_hours_is_a_mismatch_at_once(publish, registered, subscribe):
    """A publisher's data against an operator's careless pattern: Python's `re` would take hours on
    this one (partner/bounded_schemas.py)."""
    registered("lead.slow", {"type": "object", "properties": {"name": {"type": "string", "pattern": "^(a|aa)+$"}}})
    subscribe("https://hooks.partner.example/x")
    started = time.monotonic()
    response = publish({"organization": "acme", "event": "lead.slow", "data": {"name": "a" * 60 + "b"}})
    assert time.monotonic() - started < 5
    assert field_codes(response) == [("data", "schema_mismatch")]
    assert "took too long" in response.get_json()["errors"][0]["message"]
    assert publish({"organization": "acme", "event": "lead.slow", "data": {"name": "aaa"}}).status_code == 202
