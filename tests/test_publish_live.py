"""Publishing through real services (CONTRACT §11), as the platform's services would: `flask
publishers create` and `flask event-types add`, then events published over HTTP and delivered to a
real receiver on 127.0.0.1. On PostgreSQL, two services on one database: each delivery exactly once,
and an Idempotency-Key holds across them."""

import json
import subprocess
import sys
from collections import Counter

import pytest
import requests

from examples.publisher import Publisher, PublishError
from tests.gunicorn_server import ROOT, Gunicorn, flask
from tests.support import EVENTS, WEBHOOKS, bearer, eventually, free_port, lead, open_database, run_together

pytestmark = pytest.mark.both_databases


@pytest.fixture
def platform(server_env, tmp_path, receiver, session):
    """(the running services' base URLs: one, or two on PostgreSQL; the publisher's headers), with an
    organization subscribed twice to `receiver`, once to every type and once to `lead.*`."""
    server_env["PARTNER_WEBHOOK_ALLOWED_NETWORKS"] = '["127.0.0.0/8"]'
    open_database(server_env["PARTNER_DATABASE_URL"]).close_all()
    key = flask(server_env, "keys", "create", "--org", "acme", "--scope", "webhooks:manage")
    credential = flask(server_env, "publishers", "create", "billing")
    flask(server_env, "event-types", "add", "lead.created", "--description", "A lead was created.")
    services = 2 if server_env["PARTNER_DATABASE_URL"].startswith("postgresql") else 1
    servers = [Gunicorn({**server_env, "PORT": str(free_port())}, tmp_path / f"gunicorn{n}") for n in range(services)]
    try:
        for server in servers:
            server.wait_until_serving(session)
        for events in (None, ["lead.*"]):
            created = session.post(servers[0].base_url + WEBHOOKS, json={"url": receiver.url, "events": events},
                                   headers=bearer(key), timeout=10)
            assert created.status_code == 201, created.text
        yield [server.base_url for server in servers], bearer(credential)
    finally:
        for server in servers:
            server.stop()


def test_every_publish_is_delivered_once_to_each_subscription(platform, receiver, session):
    bases, headers = platform
    published = []
    for n in range(20):
        batch = {"events": [lead(data={"lead_id": f"ld_{n}_{m}"}) for m in range(5)]}
        answer = session.post(bases[n % len(bases)] + EVENTS + "/batch", json=batch, headers=headers, timeout=10)
        assert answer.status_code == 202, answer.text
        published += [event["id"] for event in answer.json()["data"]]
    assert eventually(lambda: len(receiver.received) >= 2 * len(published), 60)
    arrived = Counter((json.loads(r.body)["id"], json.loads(r.body)["subscription_id"]) for r in receiver.received)
    assert sorted(Counter(event for event, _ in arrived).values()) == [2] * len(published)
    assert set(arrived.values()) == {1} and {event for event, _ in arrived} == set(published)


def test_one_idempotency_key_sent_to_every_service_at_once_queues_once(platform, receiver, session):
    bases, headers = platform
    answers = []

    def send(base: str):
        def post():
            with requests.Session() as http:
                http.trust_env = False
                answers.append(http.post(base + EVENTS, json=lead(), timeout=10,
                                         headers={**headers, "Idempotency-Key": "order-7"}))
        return post
    assert run_together(*(send(base) for base in bases * 3)) == []
    statuses = Counter(answer.status_code for answer in answers)
    # 503: past the publishes one process answers at once (publish_api.PUBLISHES_AT_ONCE); send it again.
    assert statuses[202] == 1 and set(statuses) <= {200, 202, 409, 503}, [a.text for a in answers]
    ids = {answer.json()["id"] for answer in answers if answer.status_code in (200, 202)}
    assert len(ids) == 1
    assert eventually(lambda: len(receiver.received) >= 2, 30)
    replay = session.post(bases[-1] + EVENTS, json=lead(), headers={**headers, "Idempotency-Key": "order-7"}, timeout=10)
    assert (replay.status_code, replay.json()["id"]) == (200, ids.pop())
    assert len(receiver.received) == 2


def test_the_example_publisher_publishes_once_per_key(platform, receiver, server_env):
    bases, headers = platform
    credential = headers["Authorization"].removeprefix("Bearer ")
    ran = subprocess.run([sys.executable, "examples/publisher.py", "acme", "lead.created", '{"lead_id": "ld_9"}'],
                         cwd=ROOT, capture_output=True, text=True, timeout=30,
                         env={**server_env, "PUBLISHER_CREDENTIAL": credential, "PUBLISH_URL": bases[0]})
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout)["subscriptions"] == 2
    publisher = Publisher(credential, bases[-1])
    batch = [{"organization": "acme", "event": "lead.created", "data": {"lead_id": f"ld_{n}"}} for n in range(3)]
    first, again = publisher.publish_batch(batch, key="nightly-1"), publisher.publish_batch(batch, key="nightly-1")
    assert first == again and len(first) == 3
    with pytest.raises(PublishError) as refused:
        publisher.publish("acme", "lead.unknown", {})
    assert (refused.value.status, refused.value.problem["code"]) == (422, "validation_error")
    assert eventually(lambda: len(receiver.received) >= 8, 30)
