"""PostgreSQL stopped under a serving process: every endpoint answers 503 problem+json with Retry-After,
nothing is changed, and once the server is back the same process serves again.

The server is this test's own (`own_postgres_server`): the session's is shared by every PostgreSQL test.
"""

import logging
import time

import pytest

from models import Delivery, db
from tests.receivers import Receiver, late
from tests.support import (ME, PUBLIC_URL, SLACK_SECONDS, WEBHOOKS, assert_unavailable, counting_scans, eventually,
                           json_of)


@pytest.fixture
def database_url(own_postgres_server):
    return own_postgres_server.url(own_postgres_server.create_schema())


def every_endpoint(client, auth, subscription):
    sid = subscription["id"]
    return {
        "GET /me": lambda: client.get(ME, headers=auth),
        "GET /webhooks": lambda: client.get(WEBHOOKS, headers=auth),
        "POST /webhooks": lambda: client.post(WEBHOOKS, json={"url": PUBLIC_URL}, headers=auth),
        "DELETE /webhooks/{id}": lambda: client.delete(f"{WEBHOOKS}/{sid}", headers=auth),
        "POST /webhooks/{id}/test": lambda: client.post(f"{WEBHOOKS}/{sid}/test",
                                                        json={"secret": subscription["secret"]},
                                                        headers=auth),
        "GET /webhooks/{id}/failures": lambda: client.get(f"{WEBHOOKS}/{sid}/failures", headers=auth),
    }


def test_postgresql_stopped_is_503_everywhere_and_the_same_process_serves_after_restart(
        own_postgres_server, client, auth):
    subscription = client.post(WEBHOOKS, json={"url": PUBLIC_URL}, headers=auth).get_json()
    endpoints = every_endpoint(client, auth, subscription)
    assert client.get(ME, headers=auth).status_code == 200  # pooled connections now exist

    own_postgres_server.pause()
    for name, request in endpoints.items():
        started = time.monotonic()
        assert_unavailable(request())
        assert time.monotonic() - started < SLACK_SECONDS, name  # not the pool's 10 s wait for a connection

    own_postgres_server.resume()
    assert client.get(ME, headers=auth).status_code == 200
    listed = client.get(WEBHOOKS, headers=auth).get_json()["data"]
    assert [row["id"] for row in listed] == [subscription["id"]]  # nothing was changed meanwhile
    assert client.get(f"{WEBHOOKS}/{subscription['id']}/failures", headers=auth).get_json()["data"] == []


@pytest.mark.config(SCHEDULER_ENABLED=True, DELIVERY_POLL_INTERVAL=0.05,
                    WEBHOOK_ALLOWED_NETWORKS=["127.0.0.0/8"])
def test_through_an_outage_the_scanner_backs_off_logs_once_and_every_acknowledged_event_is_delivered(
        own_postgres_server, app, client, auth, caplog):
    receiver = Receiver(script=[late(0.3)]).start()  # attempts are still in flight when the database goes away
    dispatcher = app.extensions["delivery"]
    scans = counting_scans(dispatcher)
    try:
        subscription = json_of(client.post(WEBHOOKS, json={"url": receiver.url}, headers=auth), 201)
        dispatcher.start()
        acknowledged = {json_of(client.post(f"{WEBHOOKS}/{subscription['id']}/test",
                                            json={"secret": subscription["secret"]}, headers=auth), 202)["id"]
                        for _ in range(3)}
        own_postgres_server.pause()
        polls_before = len(scans)
        assert eventually(lambda: len(scans) >= polls_before + 60)  # 60 polls through the outage
        own_postgres_server.resume()
        assert eventually(lambda: acknowledged <= arrived(receiver))
        assert eventually(lambda: open_deliveries() == 0)  # every outcome was recorded, none left in flight
    finally:
        dispatcher.stop()
        receiver.stop()
    scans = [r for r in caplog.records if r.name in ("partner.store.availability", "apscheduler.executors.default")
             and r.levelno >= logging.ERROR]
    assert 1 <= len(scans) <= 3, [r.getMessage() for r in scans]  # once per distinct failure, not per poll


def arrived(receiver) -> set[str]:
    return {request.headers["X-VC-Event-Id"] for request in receiver.received}


def open_deliveries() -> int:
    with db.connection_context():
        return Delivery.select().where(Delivery.state.in_([Delivery.PENDING, Delivery.IN_FLIGHT])).count()
