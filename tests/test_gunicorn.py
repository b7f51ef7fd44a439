"""One real gunicorn, as `make run` starts it: serves the API, keeps secrets out of its log, stops cleanly."""

import json
import sqlite3

import pytest
from playhouse.db_url import connect

from partner.keys import parse_key
from tests.gunicorn_server import STOP_SECONDS, Gunicorn, flask
from tests.receivers import Receiver, late
from tests.support import ME, PUBLIC_IP, WEBHOOKS, bearer, eventually, free_port, raw_exchange


def test_gunicorn_serves_logs_no_secret_and_stops_cleanly(gunicorn, smoke_key, session):
    gunicorn.wait_until_serving(session)
    url = gunicorn.base_url + ME

    anonymous = session.get(url, timeout=5)
    assert anonymous.status_code == 401
    assert anonymous.headers["Content-Type"] == "application/problem+json"
    assert anonymous.json()["code"] == "unauthorized"

    identified = session.get(url, headers=bearer(smoke_key), timeout=5)
    assert identified.status_code == 200
    assert identified.json()["organization"] == "smoke"

    in_query = session.get(url, params={"api_key": smoke_key}, timeout=5)
    assert in_query.status_code == 401

    assert gunicorn.stop() == 0
    stdout, stderr = gunicorn.output()
    access_lines = [line for line in stdout.splitlines() if f'"GET {ME} HTTP/1.1"' in line]
    assert len(access_lines) == 3, stdout
    _, secret = parse_key(smoke_key)
    for text in (stdout, stderr):
        assert secret not in text and smoke_key not in text
        assert "api_key" not in text and f"{ME}?" not in text
    assert "Traceback" not in stderr, stderr


def test_workers_that_count_rate_limits_each_in_memory_are_announced_once_at_start_up(server_env, smoke_key,
                                                                                       tmp_path, session):
    server = Gunicorn({**server_env, "GUNICORN_CMD_ARGS": "--workers=2", "PARTNER_SCHEDULER_ENABLED": "false"},
                      tmp_path)
    server.wait_until_serving(session)
    assert server.stop() == 0
    warned = [line for line in server.output()[1].splitlines() if "count rate limits in their own memory" in line]
    assert len(warned) == 1 and "[WARNING]" in warned[0], server.output()[1]


@pytest.mark.parametrize("chunks", [b"zz\r\n{}\r\n0\r\n\r\n",        # a chunk size that is not hex
                                    b"2\r\n{}XX0\r\n\r\n",            # no CRLF after the chunk
                                    b"-2\r\n{}\r\n0\r\n\r\n"])
def test_a_malformed_chunked_body_is_400_problem_json(gunicorn, smoke_key, session, chunks):
    gunicorn.wait_until_serving(session)
    status, headers, body = raw_exchange(gunicorn.port, (
        f"POST /api/v1/partner/webhooks HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {smoke_key}\r\n"
        "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    ).encode() + chunks)
    assert (status, headers["content-type"]) == (400, "application/problem+json"), body
    assert json.loads(body)["code"] == "invalid_json"
    assert "Traceback" not in gunicorn.output()[1]


@pytest.mark.parametrize("path", ["//api/v1/partner/me", "/api/v1/partner//me", "/api//v1/partner/me"])
def test_a_doubled_slash_is_a_404_problem_not_a_redirect(gunicorn, smoke_key, session, path):
    gunicorn.wait_until_serving(session)
    status, headers, body = raw_exchange(gunicorn.port, (
        f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {smoke_key}\r\n"
        "Connection: close\r\n\r\n").encode())
    assert (status, headers["content-type"]) == (404, "application/problem+json"), body
    assert json.loads(body)["code"] == "not_found"


def framed(body: bytes, framing: str) -> bytes:
    """`body` as the bytes of a message body and the header that frames it."""
    if framing == "chunked":
        return b"Transfer-Encoding: chunked\r\n\r\n" + b"".join(
            b"%x\r\n%s\r\n" % (len(body[i:i + 8192]), body[i:i + 8192]) for i in range(0, len(body), 8192)
        ) + b"0\r\n\r\n"
    return b"Content-Length: %d\r\n\r\n%s" % (len(body), body)


def padded_subscription(size: int) -> bytes:
    """A valid subscription whose JSON text is `size` bytes: the object, then blanks."""
    return json.dumps({"url": "http://93.184.215.14/hook"}).encode().ljust(size)


@pytest.mark.parametrize("framing", ["chunked", "content-length"])
@pytest.mark.parametrize("size, status", [(64 * 1024, 201), (64 * 1024 + 1, 413), (1024 * 1024, 413)])
def test_a_body_over_64_kib_is_413_however_it_is_framed_never_cut(gunicorn, smoke_key, session, framing, size,
                                                                  status):
    gunicorn.wait_until_serving(session)
    answer, headers, body = raw_exchange(gunicorn.port, (
        f"POST {WEBHOOKS} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {smoke_key}\r\n"
        "Content-Type: application/json\r\n").encode() + framed(padded_subscription(size), framing))
    assert answer == status, body
    listed = session.get(gunicorn.base_url + WEBHOOKS, headers=bearer(smoke_key), timeout=5).json()["data"]
    assert len(listed) == (1 if status == 201 else 0)
    if status == 413:
        assert headers["content-type"] == "application/problem+json"
        assert json.loads(body)["code"] == "payload_too_large"


@pytest.mark.both_databases
def test_sigterm_with_attempts_in_flight_strands_nothing_and_a_restart_delivers_the_rest_once(
        server_env, smoke_key, session, tmp_path, database_url):
    server_env["PARTNER_WEBHOOK_ALLOWED_NETWORKS"] = '["127.0.0.0/8"]'
    server_env["PARTNER_DELIVERY_CONCURRENCY"] = "4"
    receiver = Receiver(script=[late(1)]).start()  # healthy but slow: attempts are in flight at SIGTERM
    first = Gunicorn(server_env, tmp_path)
    second = None
    try:
        first.wait_until_serving(session)
        api = first.base_url + "/api/v1/partner/webhooks"
        auth = bearer(smoke_key)
        events = set()
        for n in range(4):
            subscription = session.post(api, json={"url": f"{receiver.url}/{n}"}, headers=auth, timeout=5).json()
            for _ in range(3):
                events.add(session.post(f"{api}/{subscription['id']}/test", headers=auth, timeout=5,
                                        json={"secret": subscription["secret"]}).json()["id"])
        assert receiver.wait_for(1)
        assert first.stop() == 0  # SIGTERM while attempts are in flight
        assert in_flight(database_url) == 0
        sent_before_restart = len(receiver.received)
        assert sent_before_restart < len(events)

        (tmp_path / "again").mkdir()
        second = Gunicorn(server_env, tmp_path / "again")
        second.wait_until_serving(session)
        assert receiver.wait_for(len(events))
        assert eventually(lambda: undelivered(database_url) == 0)  # nothing left to send: none comes again
        ids = [request.headers["X-VC-Event-Id"] for request in receiver.received]
        assert sorted(ids) == sorted(events)  # each exactly once
        assert "Traceback" not in first.output()[1]
    finally:
        for server in (first, second):
            if server and server.process.poll() is None:
                server.process.kill()
                server.process.wait(timeout=STOP_SECONDS)
        receiver.stop()


def in_flight(database_url: str) -> int:
    return deliveries_counted(database_url, "state = 'in_flight'")


def undelivered(database_url: str) -> int:
    return deliveries_counted(database_url, "state <> 'delivered'")


def deliveries_counted(database_url: str, where: str) -> int:
    database = connect(database_url)
    try:
        return database.execute_sql(f"SELECT count(*) FROM delivery WHERE {where}").fetchone()[0]
    finally:
        database.close()


def commit_from_outside(path: str, sql: str) -> None:
    """A plain sqlite3 connection, not the service's, commits `sql`."""
    with sqlite3.connect(path) as connection:
        connection.execute(sql)
    connection.close()


def test_every_process_sees_a_revocation_or_a_change_from_another_process_at_the_next_request(
        server_env, smoke_key, tmp_path, session):
    """Two gunicorns on one database (a worker each), both having read the keys and the page."""
    servers = [Gunicorn(dict(server_env, PORT=str(free_port())), tmp_path / f"server{n}")
               for n in range(2)]
    database_path = server_env["PARTNER_DATABASE_URL"].removeprefix("sqlite:///")
    other_key = flask(server_env, "keys", "create", "--org", "smoke", "--scope", "webhooks:manage")
    try:
        for server in servers:
            server.wait_until_serving(session)

        def statuses(key) -> set[int]:
            return {session.get(server.base_url + ME, headers=bearer(key), timeout=5).status_code
                    for server in servers for _ in range(2)}

        def failures_shown() -> set[int]:
            return {session.get(server.base_url + WEBHOOKS, headers=bearer(smoke_key), timeout=5)
                    .json()["data"][0]["consecutive_failures"] for server in servers for _ in range(2)}

        created = session.post(servers[0].base_url + WEBHOOKS, headers=bearer(smoke_key), timeout=5,
                               json={"url": f"https://{PUBLIC_IP}/hook"})  # never sent anything
        assert created.status_code == 201
        assert statuses(smoke_key) == statuses(other_key) == {200}
        assert failures_shown() == {0}
        commit_from_outside(database_path, "UPDATE subscription SET consecutive_failures = 7")
        assert failures_shown() == {7}

        flask(server_env, "keys", "revoke", parse_key(smoke_key)[0])
        assert statuses(smoke_key) == {401}
        commit_from_outside(database_path, "UPDATE api_key SET revoked_at = 1")
        assert statuses(other_key) == {401}
    finally:
        for server in servers:
            assert server.stop() == 0
