"""/metrics (docs/operations.md) through the real app: names, types, labels, and no id or URL in a label.

Counters live in this test process and only grow, so every assertion compares before and after.
"""

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.receivers import Receiver, too_many_after_retry_after
from tests.support import WEBHOOKS, run_through_backoffs


DOCUMENTED_METRICS = {  # name: (type, label names)
    "partner_http_requests": ("counter", {"method", "route", "status"}),
    "partner_http_request_duration_seconds": ("histogram", {"route"}),
    "partner_delivery_attempts": ("counter", {"event", "outcome"}),
    "partner_delivery_attempt_duration_seconds": ("histogram", {"outcome"}),
    "partner_deliveries_dead_lettered": ("counter", set()),
    "partner_subscriptions_auto_disabled": ("counter", set()),
    "partner_rate_limited": ("counter", {"kind"}),
    "partner_deliveries_due": ("gauge", set()),
    "partner_delivery_oldest_due_seconds": ("gauge", set()),
    "partner_deliveries_ready": ("gauge", set()),
    "partner_delivery_oldest_ready_seconds": ("gauge", set()),
    "partner_subscriptions_limited": ("gauge", {"reason"}),
}


def scrape(client, **request) -> dict:
    """{(sample name, frozenset of labels): value} of one scrape, and each family's type."""
    response = client.get("/metrics", **request)
    assert response.status_code == 200
    assert response.content_type.startswith("text/plain")
    samples, types = {}, {}
    for family in text_string_to_metric_families(response.text):
        types[family.name] = (family.type, family)
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return {"samples": samples, "types": types}


def value(scraped: dict, name: str, **labels) -> float:
    return scraped["samples"].get((name, frozenset(labels.items())), 0.0)


# One attempt per event; the second failure in a row auto-disables.
pytestmark = pytest.mark.config(WEBHOOK_ALLOWED_NETWORKS=["127.0.0.0/8"], DELIVERY_RETRY_DELAYS=[],
                                AUTO_DISABLE_THRESHOLD=2)


@pytest.fixture
def failing_receiver():
    receiver = Receiver(script=[500]).start()
    yield receiver
    receiver.stop()


def test_every_contract_metric_is_exposed_with_its_type_and_labels(client, auth):
    client.get(WEBHOOKS, headers=auth)
    families = scrape(client)["types"]
    for name, (kind, labels) in DOCUMENTED_METRICS.items():
        assert name in families, name
        family_type, family = families[name]
        assert family_type == kind, name
        for sample in family.samples:
            assert set(sample.labels) - {"le"} == labels, (name, sample)


def test_a_request_is_counted_under_its_url_rule_not_its_path(client, auth):
    route = "/api/v1/partner/webhooks/<subscription_id>"
    before = value(scrape(client), "partner_http_requests_total", method="DELETE", route=route,
                   status="404")
    client.delete(f"{WEBHOOKS}/wh_doesnotexist0000000", headers=auth)
    after = scrape(client)
    assert value(after, "partner_http_requests_total", method="DELETE", route=route,
                 status="404") == before + 1
    assert value(after, "partner_http_request_duration_seconds_count", route=route) >= 1


@pytest.mark.parametrize("method, path, route", [
    ("PUT", WEBHOOKS, "/api/v1/partner/webhooks"),
    ("GET", f"{WEBHOOKS}/wh_x/test", "/api/v1/partner/webhooks/<subscription_id>/test"),
    ("POST", "/healthz", "/healthz"),
])
def test_a_405_is_counted_under_the_route_its_path_names(client, auth, method, path, route):
    before = value(scrape(client), "partner_http_requests_total", method=method, route=route, status="405")
    assert client.open(path, method=method, headers=auth).status_code == 405
    after = scrape(client)
    assert value(after, "partner_http_requests_total", method=method, route=route, status="405") == before + 1
    assert value(after, "partner_http_requests_total", method=method, route="unmatched", status="405") == 0


def test_unmatched_paths_and_odd_methods_share_fixed_labels(client):
    before = value(scrape(client), "partner_http_requests_total", method="other", route="unmatched",
                   status="404")
    client.open("/wh_secret/evt_x/http:/example", method="BREW")
    assert value(scrape(client), "partner_http_requests_total", method="other", route="unmatched",
                 status="404") == before + 1


@pytest.mark.config(OPS_PORT=9100)
def test_requests_refused_before_their_route_runs_are_counted_too(client):
    """The other port's 404 (PARTNER_OPS_PORT) and a doubled slash's: every answered request counts."""
    ops_port = {"base_url": "http://localhost:9100"}
    before = scrape(client, **ops_port)
    client.get("/healthz")
    client.get("/api/v1//partner/me")
    after = scrape(client, **ops_port)
    for route in ("/healthz", "unmatched"):
        assert value(after, "partner_http_requests_total", method="GET", route=route, status="404") == \
            value(before, "partner_http_requests_total", method="GET", route=route, status="404") + 1, route


@pytest.mark.config(AUTH_FAILURE_RATE_LIMIT=1)
def test_refused_requests_are_counted_by_kind(client, issue_key):
    before = value(scrape(client), "partner_rate_limited_total", kind="failed_auth")
    for _ in range(3):
        client.get(WEBHOOKS, headers={"Authorization": "Bearer nope"})
    assert value(scrape(client), "partner_rate_limited_total", kind="failed_auth") == before + 2
    key = issue_key(org="tiny", rate_limit=1)
    before = value(scrape(client), "partner_rate_limited_total", kind="organization")
    for _ in range(2):
        client.get("/api/v1/partner/me", headers={"Authorization": key})
    assert value(scrape(client), "partner_rate_limited_total", kind="organization") == before + 1


def test_attempts_dead_letters_and_the_due_backlog_are_counted(app, client, auth, clock,
                                                               failing_receiver):
    subscription = client.post(WEBHOOKS, json={"url": failing_receiver.url}, headers=auth).get_json()
    before = scrape(client)
    client.post(f"{WEBHOOKS}/{subscription['id']}/test", json={"secret": subscription["secret"]},
                headers=auth)
    clock.advance(30)
    queued = scrape(client)
    assert value(queued, "partner_deliveries_due") == value(queued, "partner_deliveries_ready") == 1
    assert value(queued, "partner_delivery_oldest_due_seconds") == value(queued, "partner_delivery_oldest_ready_seconds") == 30
    assert app.extensions["delivery"].run_due() == 1
    after = scrape(client)
    assert value(after, "partner_deliveries_due") == 0
    labels = {"event": "vc.test.ping", "outcome": "http_status"}
    assert value(after, "partner_delivery_attempts_total", **labels) == \
        value(before, "partner_delivery_attempts_total", **labels) + 1
    assert value(after, "partner_delivery_attempt_duration_seconds_count", outcome="http_status") == \
        value(before, "partner_delivery_attempt_duration_seconds_count", outcome="http_status") + 1
    assert value(after, "partner_deliveries_dead_lettered_total") == \
        value(before, "partner_deliveries_dead_lettered_total") + 1


def test_no_label_value_names_an_organization_a_subscription_an_event_or_a_url(
        app, client, auth, failing_receiver):
    subscription = client.post(WEBHOOKS, json={"url": failing_receiver.url}, headers=auth).get_json()
    event = client.post(f"{WEBHOOKS}/{subscription['id']}/test",
                        json={"secret": subscription["secret"]}, headers=auth).get_json()
    app.extensions["delivery"].run_due()
    client.get(f"{WEBHOOKS}/{subscription['id']}/failures", headers=auth)
    client.get(f"/{subscription['id']}?url={failing_receiver.url}")
    forbidden = ("acme", subscription["id"], event["id"], "wh_", "evt_", "://", "127.0.0.1",
                 str(failing_receiver.server.server_port))
    labels = {v for (_, pairs) in scrape(client)["samples"] for _, v in pairs}
    assert "/api/v1/partner/webhooks/<subscription_id>/failures" in labels
    for label in labels:
        assert not any(word in label for word in forbidden), label


def test_an_auto_disable_is_counted(app, client, auth, failing_receiver, clock):
    subscription = client.post(WEBHOOKS, json={"url": failing_receiver.url}, headers=auth).get_json()
    before = value(scrape(client), "partner_subscriptions_auto_disabled_total")
    for _ in range(2):  # AUTO_DISABLE_THRESHOLD=2
        client.post(f"{WEBHOOKS}/{subscription['id']}/test", json={"secret": subscription["secret"]},
                    headers=auth)
    assert run_through_backoffs(app.extensions["delivery"], clock) == 2
    assert value(scrape(client), "partner_subscriptions_auto_disabled_total") == before + 1


@pytest.mark.config(WEBHOOK_ALLOWED_NETWORKS=["127.0.0.0/8"])
def test_a_subscription_its_receiver_holds_is_due_but_not_ready(app, client, auth, clock, start_receiver):
    """One partner answering 429 with Retry-After while every other is current: the ready gauges,
    which the alert rule watches, say the service owes nothing; the due ones count what waits."""
    held = client.post(WEBHOOKS, json={"url": start_receiver(script=[too_many_after_retry_after(5)]).url}, headers=auth).get_json()
    current = client.post(WEBHOOKS, json={"url": start_receiver().url}, headers=auth).get_json()
    for subscription in (held, held, held, current):
        client.post(f"{WEBHOOKS}/{subscription['id']}/test", json={"secret": subscription["secret"]}, headers=auth)
    assert app.extensions["delivery"].run_due() == 2  # the held one's first (429: held) and the current one's
    clock.advance(0.5)
    scraped = scrape(client)
    assert value(scraped, "partner_deliveries_due") == 2  # the held subscription's two others
    assert (value(scraped, "partner_deliveries_ready"), value(scraped, "partner_delivery_oldest_ready_seconds")) == (0, 0)
    assert client.get("/readyz").status_code == 200
