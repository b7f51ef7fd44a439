"""/healthz, /readyz and X-Request-Id (docs/operations.md), through the real app on a real database."""

import functools
import os
import random
import re
import sqlite3
import threading
import time

import pytest
from playhouse.db_url import connect

from models import db
from partner.store.backlog import DatabaseUnavailable
from partner.store.sql import write_transaction
from partner.edge.health import Recent
from partner.errors import StartRefused
from tests.support import PUBLIC_URL, WEBHOOKS, assert_problem, assert_unavailable, eventually
from tests.test_fair_claims import enqueue_ping, subscriptions

HEX_ID = r"[0-9a-f]{32}"
# Within this, /readyz answers while another process holds SQLite's write lock (its probe waits 0.1 s).
PROBE_BOUND_SECONDS = 1.0
# Deliveries sent while /readyz is asked again and again.
DRAIN = 400


def test_healthz_says_ok(client):
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.get_json() == {"status": "ok"}


def test_readyz_reports_the_database_the_scheduler_and_the_due_backlog(client, auth, clock):
    subscription = client.post(WEBHOOKS, json={"url": "https://hooks.partner.example/in"},
                               headers=auth).get_json()
    for _ in range(2):
        client.post(f"{WEBHOOKS}/{subscription['id']}/test", json={"secret": subscription["secret"]},
                    headers=auth)
    clock.advance(90)
    response = client.get("/readyz")
    assert response.status_code == 200
    assert response.get_json() == {"status": "ready", "database": "ok", "scheduler": "disabled",
                                   "deliveries_due": 2, "oldest_due_seconds": 90.0}


def test_a_deleted_subscriptions_deliveries_are_no_backlog(client, auth, clock):
    """Nothing will send them (the purge removes them later): neither /readyz nor the gauges count them."""
    kept, deleted = (client.post(WEBHOOKS, json={"url": f"https://hooks.partner.example/{n}"}, headers=auth)
                     .get_json() for n in range(2))
    for subscription in (kept, deleted, deleted):
        client.post(f"{WEBHOOKS}/{subscription['id']}/test", json={"secret": subscription["secret"]}, headers=auth)
    assert client.delete(f"{WEBHOOKS}/{deleted['id']}", headers=auth).status_code == 204
    clock.advance(90)
    assert client.get("/readyz").get_json()["deliveries_due"] == 1
    assert "partner_deliveries_due 1.0" in client.get("/metrics").text


def test_readyz_with_nothing_due(client):
    assert client.get("/readyz").get_json()["deliveries_due"] == 0
    assert client.get("/readyz").get_json()["oldest_due_seconds"] == 0


@pytest.mark.config(SCHEDULER_ENABLED=True)
def test_readyz_says_whether_this_process_runs_the_scheduler(app, client):
    assert client.get("/readyz").get_json()["scheduler"] == "stopped"
    app.extensions["delivery"].start()
    try:
        assert client.get("/readyz").get_json()["scheduler"] == "running"
    finally:
        app.extensions["delivery"].stop()


def assert_not_ready(response, started: float) -> None:
    assert time.monotonic() - started < 5  # bounded: 2 s, plus a slow machine's margin
    assert assert_problem(response, 503, "not_ready")["detail"].startswith("database: ")


def test_readyz_is_503_while_another_process_holds_the_sqlite_write_lock(client, database_url):
    """An operator's sqlite3 shell (or a backup tool) holds the write lock: /readyz says so at once,
    though nothing has tried to write yet, and is ready again as soon as the lock is let go."""
    shell = sqlite3.connect(database_url.removeprefix("sqlite:///"), isolation_level=None)
    shell.execute("BEGIN IMMEDIATE")
    try:
        started = time.monotonic()
        detail = assert_problem(client.get("/readyz"), 503, "not_ready")["detail"]
        assert detail == "database: another process holds the database's write lock (writes wait for it)."
        assert time.monotonic() - started < PROBE_BOUND_SECONDS
        assert client.get("/healthz").status_code == 200  # liveness touches no database
    finally:
        shell.execute("ROLLBACK")
        shell.close()
    assert client.get("/readyz").status_code == 200


@pytest.mark.config(SCHEDULER_ENABLED=True, WEBHOOK_ALLOWED_NETWORKS=["127.0.0.0/8"])
def test_the_services_own_writes_never_make_readyz_flap(client, clock, dispatcher, organization, receiver):
    """While the scanner claims and records deliveries back to back, the write lock is the service's
    own nearly all the time: /readyz asked all through the drain answers 200 every time."""
    for subscription in subscriptions(organization("acme"), 8, receiver.url):
        for _ in range(DRAIN // 8):
            enqueue_ping(subscription, int(clock() * 1000))
    answers, drained = [], threading.Event()

    def ask_until_drained():  # a thread of its own: this one holds a connection of the test's
        while not drained.is_set():
            answers.append(client.get("/readyz").status_code)
    asking = threading.Thread(target=ask_until_drained)
    asking.start()
    dispatcher.start()
    try:
        assert receiver.wait_for(DRAIN, seconds=120)
    finally:
        drained.set()
        asking.join()
    assert len(answers) >= 20
    assert set(answers) == {200}


def test_with_no_scheduler_readiness_comes_back_by_itself_once_a_held_lock_is_let_go(brief_busy_timeout, client, auth,
                                                                                    database_url):
    """An operator's sqlite3 shell holds the write lock. While it does, /readyz says not ready; once
    it lets go, /readyz finds out by itself (its probe takes the write lock and lets it go, writing
    nothing): no partner write, no scheduler in between."""
    shell = sqlite3.connect(database_url.removeprefix("sqlite:///"), isolation_level=None)
    shell.execute("BEGIN IMMEDIATE")
    try:
        assert_unavailable(client.post(WEBHOOKS, json={"url": PUBLIC_URL}, headers=auth))
        for _ in range(3):
            assert_problem(client.get("/readyz"), 503, "not_ready")
    finally:
        shell.execute("ROLLBACK")
        shell.close()
    before = commits(database_url, "sqlite")
    assert eventually(lambda: client.get("/readyz").status_code == 200, seconds=20)
    assert commits(database_url, "sqlite") == before  # the probe wrote nothing
    assert client.post(WEBHOOKS, json={"url": PUBLIC_URL}, headers=auth).status_code == 201


def test_a_write_of_the_service_itself_longer_than_the_probe_waits_leaves_readyz_ready(client):
    """One of the service's own writes holds SQLite's lock past the probe's 0.1 s (a slow fsync, a large
    batch): the lock is the service's, and /readyz stays ready."""
    holding, done = threading.Event(), threading.Event()

    def write_slowly():
        with db.connection_context(), write_transaction():
            holding.set()
            done.wait(10)
    writer = threading.Thread(target=write_slowly)
    writer.start()
    try:
        assert holding.wait(10)
        assert client.get("/readyz").status_code == 200
    finally:
        done.set()
        writer.join()


def test_a_crowd_asking_during_an_outage_costs_one_read_and_each_gets_its_failure():
    """/readyz and /metrics read the backlog through Recent: a failure is kept as long as a value,
    and computed by one thread while the others wait for it, not each in turn."""
    recent, reads, release = Recent(60), [], threading.Event()

    def failing_read():
        reads.append(1)
        release.wait(5)
        raise DatabaseUnavailable("the database could not be read within 2 s")

    def ask():
        with pytest.raises(DatabaseUnavailable):
            recent.get(failing_read)

    crowd = [threading.Thread(target=ask) for _ in range(8)]
    for thread in crowd:
        thread.start()
    assert eventually(lambda: reads)
    release.set()
    for thread in crowd:
        thread.join()
    ask()
    assert len(reads) == 1


@pytest.mark.both_databases
def test_neither_readyz_nor_a_scrape_ever_writes_to_the_database(client, database_url, backend):
    """A hammer of either must cost the database no commit (issue 20: 800 commits a second)."""
    before = commits(database_url, backend)
    for path in ("/readyz", "/metrics") * 20:
        assert client.get(path).status_code == 200
    assert commits(database_url, backend) == before


def test_neither_readyz_nor_a_scrape_makes_a_database_file_that_has_gone(client, database_url, tmp_path):
    path = database_url.removeprefix("sqlite:///")
    for suffix in ("", "-wal", "-shm"):  # an operator moves the database away under the service
        if os.path.exists(path + suffix):
            os.rename(path + suffix, tmp_path / f"moved{suffix}")
    detail = assert_problem(client.get("/readyz"), 503, "not_ready")["detail"]
    assert detail == "database: the database could not be read within 2 s (OperationalError)."
    assert client.get("/metrics").status_code == 200
    assert not os.path.exists(path)


def commits(database_url: str, backend: str) -> int:
    """A number that grows with every write committed: SQLite's data_version, seen from a connection
    of our own, changes with every commit by another; PostgreSQL assigns a transaction id only to a
    transaction that writes, so the next one to be assigned counts them (the server is this
    suite's, and tests run one at a time)."""
    if backend == "sqlite":
        return watcher(database_url).execute("PRAGMA data_version").fetchone()[0]
    connection = connect(database_url)
    try:
        return connection.execute_sql("SELECT txid_snapshot_xmax(txid_current_snapshot())").fetchone()[0]
    finally:
        connection.close()


@functools.cache
def watcher(database_url: str) -> sqlite3.Connection:
    return sqlite3.connect(database_url.removeprefix("sqlite:///"), isolation_level=None,
                           check_same_thread=False)


def test_readyz_is_503_when_postgresql_is_down(own_postgres_server, clock, resolver):
    from tests.support import started_app
    url = own_postgres_server.url(own_postgres_server.create_schema())
    app = started_app({"DATABASE_URL": url, "CLOCK": clock, "RESOLVER": resolver,
                      "SCHEDULER_ENABLED": False})
    client = app.test_client()
    assert client.get("/readyz").get_json()["database"] == "ok"
    own_postgres_server.pg_ctl("stop", "-m", "immediate", "-w")
    started = time.monotonic()
    assert_not_ready(client.get("/readyz"), started)
    assert client.get("/healthz").status_code == 200
    metrics = client.get("/metrics")
    assert metrics.status_code == 200 and "partner_database_up 0.0" in metrics.text


@pytest.mark.config(AUTH_FAILURE_RATE_LIMIT=1)
@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/metrics"])
def test_ops_paths_need_no_key_and_are_never_rate_limited(client, path):
    for _ in range(3):
        assert client.get(path, headers={"Authorization": "Bearer not-a-key"}).status_code == 200


@pytest.mark.parametrize("path", ["/healthz", "/readyz", WEBHOOKS, "/no/such/path"])
def test_a_sane_request_id_is_echoed(client, path):
    response = client.get(path, headers={"X-Request-Id": "req-42.Abc_9"})
    assert response.headers["X-Request-Id"] == "req-42.Abc_9"


@pytest.mark.parametrize("sent", ["a" * 64, "0f8fad5b-d9cb-469f-a165-70867728950e", "9" * 32])
def test_a_short_plain_request_id_is_kept(client, sent):
    assert client.get("/healthz", headers={"X-Request-Id": sent}).headers["X-Request-Id"] == sent


@pytest.mark.parametrize("sent", [None, "", "a" * 65, "a" * 129, "-", ".", "--", "-rf", "two words",
                                  "semi;colon", "ünïcode", "line\u2028break", "<script>", "evil\x1b[2K"])
def test_a_missing_or_insane_request_id_is_replaced_by_a_generated_one(client, sent):
    headers = {} if sent is None else {"X-Request-Id": sent}
    first = client.get("/healthz", headers=headers).headers["X-Request-Id"]
    second = client.get("/healthz", headers=headers).headers["X-Request-Id"]
    assert re.fullmatch(HEX_ID, first) and first != second


def test_generated_request_ids_cannot_be_predicted_from_pythons_random(client):
    # Whatever seeds or reads the `random` module (a library, an attacker who saw earlier ids),
    # the next id does not follow from it.
    random.seed(20)
    first = client.get("/healthz").headers["X-Request-Id"]
    random.seed(20)
    assert client.get("/healthz").headers["X-Request-Id"] != first


def test_error_responses_carry_the_request_id_too(client, auth):
    for response in (client.get(WEBHOOKS), client.put(WEBHOOKS, headers=auth),
                     client.post(WEBHOOKS, data="[", headers=auth)):
        assert response.status_code >= 400
        assert len(response.headers["X-Request-Id"]) == 32


@pytest.mark.parametrize("name, bad", [("LOG_FORMAT", "xml"), ("RETENTION_DAYS", 0), ("OPS_PORT", 0), ("OPS_PORT", "9100"),
                                       ("RETENTION_DAYS", "30")])
def test_a_bad_operations_setting_stops_start_up_naming_it(config, name, bad):
    from tests.support import started_app
    with pytest.raises(StartRefused, match=f"PARTNER_{name}"):
        started_app({**config, name: bad})


def test_with_an_ops_port_a_server_without_gunicorn_sorts_requests_by_its_own_port(config):
    from tests.support import started_app
    client = started_app({**config, "OPS_PORT": 9100}).test_client()
    assert client.get("/healthz", base_url="http://localhost:9100").status_code == 200
    assert_problem(client.get("/healthz"), 404, "not_found")
    assert_problem(client.get(WEBHOOKS, base_url="http://localhost:9100"), 404, "not_found")


def test_the_ops_port_knows_every_operator_endpoint(app):
    """The paths ops_port.py keeps apart are exactly those of the health, apidocs and publish blueprints."""
    from partner.edge.ops_port import is_ops_path
    for rule in app.url_map.iter_rules():
        path = re.sub(r"<[^>]+>", "x", rule.rule)
        assert is_ops_path(path) == rule.endpoint.startswith(("health.", "apidocs.", "internal.")), rule.rule
