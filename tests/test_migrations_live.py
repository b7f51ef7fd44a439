"""A rolling restart on PostgreSQL (real gunicorn): services start again and again beside one that
is delivering. Release 1.1 ran schema.sql's DDL at every start, whose CREATE INDEX deadlocked with
the running service's record step in about half the starts; an up-to-date start now runs none."""

import pytest

from tests.gunicorn_server import STOP_SECONDS, Gunicorn, PingLoad, flask
from tests.receivers import Receiver
from tests.support import eventually, free_port

STARTS = 5
FEEDERS = 4  # subscriptions pinged without pause, one thread each


@pytest.fixture
def backend():
    return "postgresql"


def test_services_start_beside_a_delivering_one_and_every_outcome_is_recorded(
        server_env, session, tmp_path):
    server_env.update(PARTNER_WEBHOOK_ALLOWED_NETWORKS='["127.0.0.0/8"]', PARTNER_DELIVERY_RETRY_DELAYS="[0, 0]",
                      PARTNER_DELIVERY_POLL_INTERVAL="0.05")
    receiver = Receiver(script=[500, 200]).start()  # every other attempt fails: a failure is recorded
    delivering = Gunicorn(server_env, tmp_path / "delivering")
    started, load = [], None
    try:
        delivering.wait_until_serving(session)
        key = flask(server_env, "keys", "create", "--org", "rolling", "--scope", "webhooks:manage",
                    "--rate-limit", "1000000")
        load = PingLoad(delivering.base_url, key, receiver.url, FEEDERS)
        for n in range(STARTS):
            service = Gunicorn({**server_env, "PORT": str(free_port())}, tmp_path / f"start-{n}")
            started.append(service)
            service.wait_until_serving(session)  # fails the test if the worker could not boot
            assert service.stop() == 0
        load.stop()
        events = set(load.events)
        assert set(load.answers) == {202} and len(events) > STARTS
        assert eventually(lambda: delivered(receiver) >= events)
        log = delivering.output()[1]
        assert "deadlock" not in log and "not recorded" not in log
        assert all("deadlock" not in service.output()[1] for service in started)
    finally:
        if load is not None:
            load.stop()
        for server in (delivering, *started):
            if server.process.poll() is None:
                server.process.kill()
                server.process.wait(timeout=STOP_SECONDS)
        receiver.stop()


def delivered(receiver: Receiver) -> set[str]:
    return {r.headers["X-VC-Event-Id"] for r in receiver.received}
