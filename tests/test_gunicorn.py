"""One real gunicorn, as `make run` starts it: serves the API, keeps secrets out of its log, stops cleanly."""

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from keys import parse_key
from tests.receivers import Receiver
from tests.support import ME, bearer, free_port

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent  # the virtualenv the suite runs in: gunicorn and flask live beside python
BOOT_SECONDS = 10
STOP_SECONDS = 5

# None leaves PARTNER_SCHEDULER_ENABLED unset (enabled): post_worker_init starts the delivery
# scanner in the worker, as in production. Set "false" to boot without it.
SCHEDULER_ENABLED = None


@pytest.fixture
def server_env(tmp_path):
    """The environment of `make run`: ours, minus anything that would configure the app or gunicorn."""
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("PARTNER_", "GUNICORN_", "FLASK_"))}
    env.update(PORT=str(free_port()), PYTHONUNBUFFERED="1",
               PARTNER_DATABASE_URL=f"sqlite:///{tmp_path}/smoke.sqlite3")
    if SCHEDULER_ENABLED is not None:
        env["PARTNER_SCHEDULER_ENABLED"] = SCHEDULER_ENABLED
    return env


@pytest.fixture
def smoke_key(server_env):
    result = subprocess.run([BIN / "flask", "keys", "create", "--org", "smoke", "--scope", "webhooks:manage"],
                            cwd=ROOT, env=server_env, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().splitlines()[-1]


class Gunicorn:
    def __init__(self, env, log_dir: Path, app_module: str = "wsgi:app"):
        self.port = int(env["PORT"])
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.out_path, self.err_path = log_dir / "gunicorn.out", log_dir / "gunicorn.err"
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            # No control socket: it would live in $HOME and be shared with any other gunicorn.
            self.process = subprocess.Popen([BIN / "gunicorn", "--no-control-socket", app_module],
                                            cwd=ROOT, env=env, stdout=out, stderr=err)

    def output(self) -> tuple[str, str]:
        return self.out_path.read_text(), self.err_path.read_text()

    def wait_until_serving(self, session: requests.Session) -> None:
        """Poll until the worker answers HTTP; fail with gunicorn's own output if it dies or hangs."""
        deadline = time.monotonic() + BOOT_SECONDS
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"gunicorn exited with {self.process.returncode} before serving:\n"
                            f"{self.output()[1]}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                session.get(self.base_url + "/", timeout=2)
                return
            except (OSError, requests.ConnectionError, requests.Timeout):
                time.sleep(0.1)
        pytest.fail(f"gunicorn did not serve within {BOOT_SECONDS} s:\n{self.output()[1]}")

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=STOP_SECONDS)


@pytest.fixture
def gunicorn(server_env, smoke_key, tmp_path):
    server = Gunicorn(server_env, tmp_path)
    yield server
    if server.process.poll() is None:
        server.process.kill()
        server.process.wait(timeout=STOP_SECONDS)


@pytest.fixture
def session():
    with requests.Session() as http:
        http.trust_env = False  # no proxy variables, no .netrc: loopback only
        # No idle keep-alive connection for a graceful stop to wait out.
        http.headers["Connection"] = "close"
        yield http


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


def raw_exchange(port: int, request: bytes) -> tuple[int, dict, bytes]:
    """Send `request` bytes as they are (no client library fixes them up); return the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(request)
        sock.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in header_lines)
    return int(status_line.split()[1]), {k.lower(): v for k, v in headers.items()}, body


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


def slow_ok(handler):
    """A healthy receiver that takes 1 s: attempts are in flight when SIGTERM comes."""
    time.sleep(1)
    handler.send_response(200)
    handler.send_header("Content-Length", "0")
    handler.end_headers()


def test_sigterm_with_attempts_in_flight_strands_nothing_and_a_restart_delivers_the_rest_once(
        server_env, smoke_key, session, tmp_path):
    server_env["PARTNER_WEBHOOK_ALLOWED_NETWORKS"] = '["127.0.0.0/8"]'
    server_env["PARTNER_DELIVERY_CONCURRENCY"] = "4"
    receiver = Receiver(script=[slow_ok]).start()
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
        assert in_flight(tmp_path) == 0
        sent_before_restart = len(receiver.received)
        assert sent_before_restart < len(events)

        (tmp_path / "again").mkdir()
        second = Gunicorn(server_env, tmp_path / "again")
        second.wait_until_serving(session)
        assert receiver.wait_for(len(events), seconds=20)
        time.sleep(1.5)  # nothing more arrives
        ids = [request.headers["X-VC-Event-Id"] for request in receiver.received]
        assert sorted(ids) == sorted(events)  # each exactly once
        assert "Traceback" not in first.output()[1]
    finally:
        for server in (first, second):
            if server and server.process.poll() is None:
                server.process.kill()
                server.process.wait(timeout=STOP_SECONDS)
        receiver.stop()


def in_flight(tmp_path) -> int:
    with sqlite3.connect(tmp_path / "smoke.sqlite3") as database:
        return database.execute("SELECT count(*) FROM delivery WHERE state = 'in_flight'").fetchone()[0]
