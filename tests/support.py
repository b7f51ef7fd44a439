"""The tests' one vocabulary: paths, the auth header, the problem assertion, the injected clock and
resolver, a free loopback port, a raw HTTP exchange and a headless browser. Fixtures live in conftest.py; receivers in
tests/receivers.py."""

import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from peewee import fn

from app import create_app
from models import Delivery, Event, Failure, Subscription, db
from partner import sealing
from partner.envelopes import envelope
from partner.outcomes import Outcome, Recorded, write_outcomes
from partner.startup import start_service
from partner.store import migrations
from partner.store.connection import bind, make_directory, require_supported

API = "/api/v1/partner"
ME = f"{API}/me"
WEBHOOKS = f"{API}/webhooks"
PUBLIC_IP = "93.184.215.14"  # answers for names the tests pretend are public; never connected to
PUBLIC_URL = "https://hooks.partner.example/h"  # resolves to PUBLIC_IP through the resolver fixture


# The suite's PARTNER_ENCRYPTION_KEYS (PostgreSQL refuses to start without; unset, SQLite would write
# a key file into the repository's instance folder).
ENCRYPTION_KEYS = ["c3VpdGUta2V5LW5vdC1zZWNyZXQtMzItYnl0ZXMhISE"]
# A second key, for rotations: put first, it seals, and the suite's key only opens.
NEW_ENCRYPTION_KEY = "bmV3LWtleS1mb3ItdGhlLXJvdGF0aW9uLXRlc3QhISE"


def open_database(url: str):
    """Bind the process's database to `url` and bring its schema up to date, as a start does."""
    make_directory(url)
    database = bind(url)
    require_supported(database)
    migrations.upgrade(database)
    return database


def started_app(config: dict):
    """An app built and started as a service start does (partner/startup.py): the database checked,
    migrated and given its cursor key."""
    app = create_app(config)
    start_service(app)
    return app


def bearer(key: str) -> dict:
    """The Authorization header carrying `key`."""
    return {"Authorization": f"Bearer {key}"}


def assert_problem(response, status: int, code: str) -> dict:
    """Assert an RFC 9457 problem response with the contract's `code`; returns its body."""
    assert response.status_code == status, response.get_data(as_text=True)
    assert response.content_type == "application/problem+json"
    body = response.get_json()
    assert (body["status"], body["code"], body["type"]) == (status, code, "about:blank")
    assert body["title"] and body["detail"]
    return body


def assert_unavailable(response) -> None:
    """Assert the 503 a client gets while the database cannot answer: problem+json, Retry-After."""
    assert_problem(response, 503, "service_unavailable")
    assert 1 <= int(response.headers["Retry-After"]) <= 60


def json_of(response, status: int):
    """The JSON body of a response that must have `status`."""
    assert response.status_code == status, response.get_data(as_text=True)
    return response.get_json()


def validation_errors(response) -> list[dict]:
    """The `errors` of a 422 validation problem."""
    body = assert_problem(response, 422, "validation_error")
    return body["errors"]


def field_codes(response) -> list[tuple]:
    """(field, code) of each error of a 422 validation problem."""
    return [(error["field"], error["code"]) for error in validation_errors(response)]


def in_thread(work: Callable[[], object], errors: list[Exception]) -> threading.Thread:
    """Start `work` on a daemon thread of its own; what it raises is added to `errors`."""
    def run():
        try:
            work()
        except Exception as error:  # noqa: BLE001 - returned to the test
            errors.append(error)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def run_together(*work: Callable[[], object]) -> list[Exception]:
    """Run each callable on a thread of its own, all released at the same moment; returns what
    they raised."""
    start, errors = threading.Barrier(len(work)), []

    def released(job):
        def run():
            start.wait()
            job()
        return run
    for thread in [in_thread(released(job), errors) for job in work]:
        thread.join()
    return errors


# What a loaded machine may add to a real wait (a deadline, a timer, a thread's turn): a bound on
# wall-clock time allows this much, and what it guards against (an attempt the deadline does not
# cut, a poll's 60 s, a wait that never ends) takes far longer.
SLACK_SECONDS = 5.0


def eventually(condition: Callable[[], object], seconds: float = 30.0, pause: float = 0.02) -> bool:
    """Whether `condition()` comes true within `seconds`, asked again every `pause`. The default is
    generous: a condition that holds returns at once, and only a failing test waits it out."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(pause)
    return True


def counting_scans(dispatcher) -> list[int]:
    """What each scan of `dispatcher` returned (how many it started), once it returned: its
    scheduler's polls and wakes and its refills after an attempt. Call it before start()."""
    scans, scan = [], dispatcher.scan

    def counted() -> int:
        scans.append(scan())
        return scans[-1]
    dispatcher.scan = counted
    return scans


def query_plan(database, action) -> str:
    """Run `action` and return the SQLite query plans of the statements it ran, as one text."""
    statements = []
    connection = database.connection()
    connection.set_trace_callback(statements.append)
    try:
        action()
    finally:
        connection.set_trace_callback(None)
    plans = []
    for sql in statements:
        if sql.lstrip().upper().startswith(("SELECT", "UPDATE", "WITH")):
            plans += [row[-1] for row in database.execute_sql(f"EXPLAIN QUERY PLAN {sql}").fetchall()]
    return "\n".join(plans)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (a server retries if it is taken since)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def ping_as(client, headers: dict, subscription: dict):
    """POST the subscription's test trigger with `headers` (another key's, say); the response."""
    return client.post(f"{WEBHOOKS}/{subscription['id']}/test", json={"secret": subscription["secret"]},
                       headers=headers)


def raw_exchange(port: int, request: bytes) -> tuple[int, dict, bytes]:
    """Send `request` bytes as they are (no client library fixes them up); return the answer."""
    answer = b""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        try:
            sock.sendall(request)
            sock.shutdown(socket.SHUT_WR)
        # gunicorn drains at most 64 KiB of a body the app did not read, then closes: its answer is
        # already here, and a reset follows it.
        except OSError:
            pass
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except ConnectionResetError:
            pass
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in header_lines)
    return int(status_line.split()[1]), {k.lower(): v for k, v in headers.items()}, body


class FakeClock:
    """Wall-clock seconds that only move when a test says so."""

    def __init__(self, start: float | None = None):
        self.now = start if start is not None else time.time()

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class StubResolver:
    """A DNS resolver answering from `answers` (a name's list of addresses, or an exception to raise),
    else `default`; records every lookup. Names in `stalled` get no answer until `released` is set
    (the resolver fixture sets it at teardown); names in `slow` answer that many seconds after they
    are asked (or once released)."""

    def __init__(self, answers: dict | None = None, default=()):
        self.answers = dict(answers or {})
        self.default = default
        self.lookups: list[str] = []
        self.stalled: set[str] = set()
        self.slow: dict[str, float] = {}
        self.released = threading.Event()

    def __call__(self, host: str) -> list[str]:
        self.lookups.append(host)
        if host in self.stalled or host in self.slow:
            self.released.wait(self.slow.get(host, 60))
        answer = self.answers.get(host, self.default)
        if isinstance(answer, Exception):
            raise answer
        return list(answer)


def sealed(subscription_id: str, secret: str) -> dict:
    """A subscription's stored secret columns, for rows written in bulk."""
    return dict(zip(("secret_key_id", "secret_sealed"), sealing.seal(subscription_id, secret)))


# The publish endpoints, and an event of the `lead.created` type the `registered` fixture adds.
EVENTS, BATCH = "/internal/v1/events", "/internal/v1/events/batch"
LEAD_SCHEMA = {"type": "object", "required": ["lead_id"], "properties": {"lead_id": {"type": "string"}}}


def lead(org: str = "acme", **fields) -> dict:
    """A `lead.created` event's publish body, for organization `org`."""
    return {"organization": org, "event": "lead.created", "data": {"lead_id": "ld_1"}, **fields}


def run_through_backoffs(dispatcher, clock) -> int:
    """dispatcher.run_due, again each time the clock is stepped to the end of the hold a failure put
    its subscription under (partner/concurrency.py: a failing endpoint is held, not hammered), until
    nothing is held; how many attempts were made."""
    done = 0
    while True:
        done += dispatcher.run_due()
        with db.connection_context():
            held = Subscription.select(fn.MAX(Subscription.paused_until)).scalar()
        now = int(clock() * 1000)
        if held is None or held <= now:
            return done
        clock.advance((held - now) / 1000)


def history_of(subscription_id: str) -> list[int]:
    """A subscription's events (those queued to it), deliveries and failure records, counted."""
    return [Event.select().join(Delivery).where(Delivery.subscription == subscription_id).count(),
            Delivery.select().where(Delivery.subscription == subscription_id).count(),
            Failure.select().where(Failure.subscription == subscription_id).count()]


def delivery_of(event_id: str) -> Delivery:
    """The one delivery of an event queued to one subscription (a ping's)."""
    return Delivery.get(Delivery.event == event_id)


def body_of(event, subscription_id: str) -> bytes:
    """The bytes every attempt of the event's delivery to the subscription sends."""
    return envelope(event.kind, event.id, subscription_id, event.occurred_at, bytes(event.data))


def queue_in_bulk(org_id, event_ids: list[str], due_at: int, now_ms: int) -> None:
    """For each event id a subscription `wh_<event id>` of `org_id` with that event queued, due at
    `due_at`: written in bulk, for tests that need thousands (through the API they take seconds)."""
    with db.atomic():
        Subscription.insert_many([{"id": f"wh_{i}", "organization": org_id, "url": "https://x.example/",
                                   **sealed(f"wh_{i}", "whsec_x"), "created_at": now_ms} for i in event_ids]).execute()
        Event.insert_many([{"id": i, "kind": "vc.test.ping", "data": b"{}", "occurred_at": now_ms,
                            "created_at": now_ms} for i in event_ids]).execute()
        Delivery.insert_many([{"event": i, "subscription": f"wh_{i}", "state": Delivery.PENDING,
                               "due_at": due_at} for i in event_ids]).execute()


def record_attempt(claim, result, attempted_at: int, finished_at: int, policy, jitter: float) -> Recorded:
    """Record one attempt of a claim, as the dispatcher's group commit would with a batch of one."""
    [recorded] = write_outcomes([Outcome(claim, result, attempted_at, finished_at, jitter)], policy)
    return recorded


def refuse_in_sqlite(event: str) -> None:
    """Make the SQLite database itself refuse `event` ("INSERT ON failure"): a write that fails for
    real, inside whatever transaction it is part of. Until allow_in_sqlite()."""
    db.execute_sql(f"CREATE TRIGGER refused BEFORE {event} BEGIN SELECT RAISE(ABORT, 'refused'); END")


def allow_in_sqlite() -> None:
    db.execute_sql("DROP TRIGGER refused")


CHROMIUM_SECONDS = 90


def chromium(*args: str, profile: Path) -> subprocess.CompletedProcess:
    """Headless Chromium with a fresh profile and nothing of its own on the network."""
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None:
        pytest.skip("chromium is not installed (scripts/test-services.sh installs it)")
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--hide-scrollbars", f"--user-data-dir={profile}", "--virtual-time-budget=15000"]
    return subprocess.run([binary, *flags, *args], capture_output=True, text=True, timeout=CHROMIUM_SECONDS)
