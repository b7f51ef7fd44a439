"""POST /webhooks/{id}/test and GET /webhooks/{id}/failures over HTTP: answers, errors, and what gets queued.

Targets are public addresses that are never contacted: the scheduler is off and nothing runs the queue.
"""

import json
import uuid

import pytest

from partner.keys import parse_key
from models import Delivery, Event, Failure, Subscription, db
from partner.outbox import claim_due
from partner.retry import RetryPolicy
from partner.outbound.transport import AttemptResult
from tests.support import WEBHOOKS, bearer, body_of, field_codes, ping_as, record_attempt

URL = "http://93.184.215.14/hook"
CLOCK_START = 1_800_000_000.1235  # 2027-01-15T08:00:00.123Z; the half millisecond keeps floats off a boundary
START_MS = 1_800_000_000_123


@pytest.fixture
def subscription(client, auth) -> dict:
    response = client.post(WEBHOOKS, json={"url": URL}, headers=auth)
    assert response.status_code == 201, response.get_json()
    return response.get_json()


def trigger(client, headers, subscription_id: str, body=None, **kwargs):
    return client.post(f"{WEBHOOKS}/{subscription_id}/test", json=body, headers=headers, **kwargs)


def failures_as(client, headers, subscription_id: str, **query):
    return client.get(f"{WEBHOOKS}/{subscription_id}/failures", query_string=query, headers=headers)


def queued(app) -> list[tuple]:
    """Every queued delivery: (event id, subscription id, state, due_at, attempts)."""
    with app.app_context(), db.connection_context():
        rows = Delivery.select().order_by(Delivery.due_at)
        return [(d.event_id, d.subscription_id, d.state, d.due_at, d.attempts) for d in rows]


def nothing_queued(app) -> bool:
    with app.app_context(), db.connection_context():
        return Event.select().count() == 0 and Delivery.select().count() == 0


def problem(status: int, title: str, code: str, detail: str) -> dict:
    return {"type": "about:blank", "title": title, "status": status, "detail": detail, "code": code}


NOT_FOUND = problem(404, "Not Found", "not_found", "No such subscription.")


# --- the test trigger: accepted --------------------------------------------------------------------

def test_a_ping_is_accepted_with_its_event_id(client, auth, subscription):
    response = ping_as(client, auth, subscription)
    assert response.status_code == 202
    assert response.content_type == "application/json"
    body = response.get_json()
    assert body == {"id": body["id"], "event": "vc.test.ping", "subscription_id": subscription["id"],
                    "status": "queued"}
    prefix, _, text = body["id"].partition("_")
    assert (prefix, str(uuid.UUID(text, version=4))) == ("evt", text)


def test_a_ping_queues_one_delivery_due_now(app, client, auth, subscription):
    event_id = ping_as(client, auth, subscription).get_json()["id"]
    assert queued(app) == [(event_id, subscription["id"], "pending", START_MS, 0)]


def test_the_queued_envelope_is_stamped_with_the_clock_and_the_calling_key(app, client, api_key, auth,
                                                                            subscription):
    event_id = ping_as(client, auth, subscription).get_json()["id"]
    with app.app_context(), db.connection_context():
        envelope = json.loads(body_of(Event.get_by_id(event_id), subscription["id"]))
    assert envelope == {"event": "vc.test.ping", "id": event_id, "subscription_id": subscription["id"],
                        "occurred_at": "2027-01-15T08:00:00.123Z",
                        "data": {"message": envelope["data"]["message"],
                                 "triggered_by_key_id": parse_key(api_key)[0]}}


def test_each_ping_is_a_new_event(app, client, auth, subscription):
    ids = [ping_as(client, auth, subscription).get_json()["id"] for _ in range(3)]
    assert len(set(ids)) == 3
    assert sorted(row[0] for row in queued(app)) == sorted(ids)


def test_a_ping_is_queued_for_its_own_subscription_only(app, client, auth, subscription):
    other = client.post(WEBHOOKS, json={"url": URL}, headers=auth).get_json()
    ping_as(client, auth, other)
    assert [row[1] for row in queued(app)] == [other["id"]]


def test_a_subscription_with_failures_below_the_threshold_still_accepts_pings(app, client, auth, subscription):
    with app.app_context(), db.connection_context():
        Subscription.update(consecutive_failures=19).where(Subscription.id == subscription["id"]).execute()
    assert ping_as(client, auth, subscription).status_code == 202


# --- the test trigger: refused ---------------------------------------------------------------------

SECRET_MISMATCH = problem(403, "Forbidden", "secret_mismatch", "The secret does not match this subscription's.")


@pytest.mark.parametrize("wrong", [
    lambda secret: secret[:-1] + ("A" if secret[-1] != "A" else "B"),
    lambda secret: secret + "x",
    lambda secret: secret[:-1],
    lambda secret: secret.removeprefix("whsec_"),
    lambda secret: secret.upper(),
    lambda secret: "whsec_",
    lambda secret: "",
    lambda secret: f" {secret}",
    lambda secret: "é" * 10,
], ids=["last-char", "longer", "shorter", "no-prefix", "case", "prefix-only", "empty", "space", "non-ascii"])
def test_a_wrong_secret_is_403_and_queues_nothing(app, client, auth, subscription, wrong):
    response = trigger(client, auth, subscription["id"], {"secret": wrong(subscription["secret"])})
    assert response.status_code == 403
    assert response.content_type == "application/problem+json"
    assert response.get_json() == SECRET_MISMATCH
    assert nothing_queued(app)


def test_another_subscriptions_secret_is_403(app, client, auth, subscription):
    other = client.post(WEBHOOKS, json={"url": URL}, headers=auth).get_json()
    response = trigger(client, auth, subscription["id"], {"secret": other["secret"]})
    assert response.get_json() == SECRET_MISMATCH
    assert nothing_queued(app)


def test_the_api_key_is_not_the_secret(app, client, api_key, auth, subscription):
    response = trigger(client, auth, subscription["id"], {"secret": api_key})
    assert response.get_json() == SECRET_MISMATCH
    assert api_key not in response.get_data(as_text=True)


@pytest.mark.parametrize("make_body, expected", [
    (lambda secret: {}, [("secret", "required")]),
    (lambda secret: {"secret": None}, [("secret", "required")]),
    (lambda secret: {"secret": 123}, [("secret", "invalid_type")]),
    (lambda secret: {"secret": True}, [("secret", "invalid_type")]),
    (lambda secret: {"secret": [secret]}, [("secret", "invalid_type")]),
    (lambda secret: {"secret": {"value": secret}}, [("secret", "invalid_type")]),
    (lambda secret: {"secret": "x" * 257}, [("secret", "too_long")]),
    (lambda secret: {"secret": secret, "event": "vc.test.ping"}, [("event", "unknown_field")]),
    (lambda secret: {"Secret": secret}, [("secret", "required"), ("Secret", "unknown_field")]),
    (lambda secret: {"token": secret, "secret": 1}, [("secret", "invalid_type"), ("token", "unknown_field")]),
], ids=["missing", "null", "number", "boolean", "list", "object", "too-long", "unknown", "wrong-case",
        "everything"])
def test_an_invalid_body_is_422_and_queues_nothing(app, client, auth, subscription, make_body, expected):
    response = trigger(client, auth, subscription["id"], make_body(subscription["secret"]))
    assert field_codes(response) == expected
    assert nothing_queued(app)


def test_a_validation_error_never_echoes_the_secret(client, auth, subscription):
    response = trigger(client, auth, subscription["id"], {"secret": subscription["secret"], "extra": 1})
    assert subscription["secret"] not in response.get_data(as_text=True)


@pytest.mark.parametrize("data", ["not json", "", "[]", "null", '"whsec_x"', "{", '{"secret": NaN}'],
                         ids=["text", "empty", "array", "null", "string", "truncated", "nan"])
def test_a_body_that_is_not_a_json_object_is_400_and_queues_nothing(app, client, auth, subscription, data):
    response = client.post(f"{WEBHOOKS}/{subscription['id']}/test", data=data,
                           headers={**auth, "Content-Type": "application/json"})
    assert response.status_code == 400
    assert response.get_json()["code"] == "invalid_json"
    assert nothing_queued(app)


def test_an_unknown_subscription_is_404(app, client, auth, subscription):
    response = trigger(client, auth, "wh_doesnotexist00000000", {"secret": subscription["secret"]})
    assert (response.status_code, response.get_json()) == (404, NOT_FOUND)
    assert nothing_queued(app)


def test_another_organizations_subscription_is_404_even_with_its_secret(app, client, issue_key, subscription):
    globex = bearer(issue_key("globex"))
    response = ping_as(client, globex, subscription)
    assert (response.status_code, response.get_json()) == (404, NOT_FOUND)
    assert nothing_queued(app)


@pytest.mark.parametrize("body", [{"data": b"nope"}, {"json": {}}, {"json": {"colour": 1}}, {"data": b"x" * 70_000}])
def test_the_subscription_is_checked_before_the_body(app, client, issue_key, auth, subscription, body):
    """decisions.md's order: the resource (404) before the body (400, 413, 422), for an unknown id
    and for another organization's alike."""
    globex = bearer(issue_key("globex"))
    for headers, subscription_id in ((auth, "wh_doesnotexist00000000"), (globex, subscription["id"])):
        response = client.post(f"{WEBHOOKS}/{subscription_id}/test", headers=headers, **body)
        assert (response.status_code, response.get_json()) == (404, NOT_FOUND)
    assert nothing_queued(app)


def test_a_deleted_subscription_is_404(app, client, auth, subscription):
    client.delete(f"{WEBHOOKS}/{subscription['id']}", headers=auth)
    assert ping_as(client, auth, subscription).get_json() == NOT_FOUND
    assert nothing_queued(app)


def test_an_auto_disabled_subscription_is_409_and_queues_nothing(app, client, auth, subscription):
    with app.app_context(), db.connection_context():
        Subscription.update(active=False, consecutive_failures=20, auto_disabled_at=START_MS).where(
            Subscription.id == subscription["id"]).execute()
    response = ping_as(client, auth, subscription)
    assert response.status_code == 409
    assert response.get_json() == problem(
        409, "Conflict", "subscription_disabled",
        f"The subscription was auto-disabled after repeated failures. Fix your endpoint, then ask the service's "
        f"operator to re-enable it (flask webhooks enable {subscription['id']}), or delete it and create a new one.")
    assert nothing_queued(app)


def test_without_a_key_it_is_401_and_queues_nothing(app, client, subscription):
    response = trigger(client, {}, subscription["id"], {"secret": subscription["secret"]})
    assert response.status_code == 401
    assert nothing_queued(app)


# --- the failures audit ----------------------------------------------------------------------------

def test_a_fresh_subscription_has_no_failures(client, auth, subscription):
    response = failures_as(client, auth, subscription["id"])
    assert (response.status_code, response.get_json()) == (200, {"data": [], "next_cursor": None})


def test_a_queued_ping_is_not_a_failure(client, auth, subscription):
    ping_as(client, auth, subscription)
    assert failures_as(client, auth, subscription["id"]).get_json() == {"data": [], "next_cursor": None}


@pytest.mark.parametrize("limit", ["1", "100"])
def test_limits_at_the_bounds_are_accepted(client, auth, subscription, limit):
    assert failures_as(client, auth, subscription["id"], limit=limit).get_json() == {"data": [], "next_cursor": None}


def test_another_organizations_failures_are_404(client, issue_key, subscription):
    response = failures_as(client, bearer(issue_key("globex")), subscription["id"])
    assert (response.status_code, response.get_json()) == (404, NOT_FOUND)


def test_an_unknown_subscriptions_failures_are_404(client, auth):
    response = failures_as(client, auth, "wh_doesnotexist00000000")
    assert (response.status_code, response.get_json()) == (404, NOT_FOUND)


@pytest.mark.parametrize("limit", ["0", "101", "abc", "-1", ""])
def test_a_limit_out_of_range_is_422(client, auth, subscription, limit):
    response = failures_as(client, auth, subscription["id"], limit=limit)
    assert field_codes(response) == [("limit", "out_of_range")]


def test_a_subscriptions_list_cursor_is_not_a_failures_cursor(client, auth, subscription):
    client.post(WEBHOOKS, json={"url": URL}, headers=auth)
    cursor = client.get(WEBHOOKS, query_string={"limit": 1}, headers=auth).get_json()["next_cursor"]
    assert cursor
    assert field_codes(failures_as(client, auth, subscription["id"], cursor=cursor)) == [("cursor", "invalid_cursor")]


def fail_every_due_delivery(app, now_ms: int) -> None:
    """Record a failed attempt for every due delivery, as the dispatcher would, without sending anything:
    one per subscription at a time, each after the backoff its last failure holds it for (under the retry delay)."""
    with app.app_context(), db.connection_context():
        while claims := claim_due(now_ms, 100, 40_000):
            for claim in claims:
                record_attempt(claim, AttemptResult(False, 500, "http_status", "", 5), now_ms, now_ms + 5,
                               RetryPolicy([60] * 6, 20), jitter=0)
            now_ms += 5_000


def test_one_subscriptions_failures_cursor_is_refused_for_another(app, client, auth, subscription):
    other = client.post(WEBHOOKS, json={"url": URL}, headers=auth).get_json()
    for target in (subscription, other):
        ping_as(client, auth, target)
        ping_as(client, auth, target)
    fail_every_due_delivery(app, START_MS)
    with app.app_context(), db.connection_context():
        assert Failure.select().count() == 4
    cursor = failures_as(client, auth, subscription["id"], limit=1).get_json()["next_cursor"]
    assert cursor
    assert failures_as(client, auth, subscription["id"], cursor=cursor).status_code == 200
    assert field_codes(failures_as(client, auth, other["id"], cursor=cursor)) == [("cursor", "invalid_cursor")]
