"""PostgreSQL frozen under a real gunicorn (SIGSTOP: its sockets take bytes and the kernel
acknowledges them; nothing answers): no wait of the service's is unbounded. /healthz answers
throughout, every partner request gets its 503 within 10 s however many wait, what was acknowledged
is delivered once the server runs again, and the outage is one ERROR line.

The server is this test's own (`own_postgres_server`): the session's is shared.
"""

import threading
import time
from dataclasses import dataclass

import pytest
import requests

from tests.gunicorn_server import Gunicorn
from tests.receivers import Receiver
from tests.support import bearer, eventually

FREEZE_SECONDS = 25
CALLERS = 24  # three times gunicorn's threads, each calling again as soon as it is answered


@pytest.fixture
def database_url(own_postgres_server):
    return own_postgres_server.url(own_postgres_server.create_schema())


@dataclass
class Answer:
    path: str
    started_at: float
    seconds: float
    status: int | None  # None: no answer within the client's timeout
    retry_after: str | None = None
    content_type: str | None = None


class Callers:
    """Threads calling the service without pause until stop(): `partners` of them POST pings or GET
    the list in turn, one asks /healthz every 0.2 s; every answer is kept."""

    def __init__(self, base_url: str, key: str, subscriptions: list[dict], partners: int):
        self.base_url, self.auth, self.subscriptions = base_url, bearer(key), subscriptions
        self.answers: list[Answer] = []
        self.acknowledged: list[str] = []
        self.stopped = threading.Event()
        self.threads = [threading.Thread(target=self._partner, args=(n,)) for n in range(partners)]
        self.threads.append(threading.Thread(target=self._health))
        for thread in self.threads:
            thread.start()

    def _call(self, http, method: str, path: str, timeout: float, **kwargs) -> requests.Response | None:
        started = time.monotonic()
        try:
            response = http.request(method, self.base_url + path, timeout=timeout, **kwargs)
        except requests.RequestException:
            response = None
        seconds = time.monotonic() - started
        if response is None:
            self.answers.append(Answer(path, started, seconds, None))
        else:
            self.answers.append(Answer(path, started, seconds, response.status_code,
                                       response.headers.get("Retry-After"), response.headers.get("Content-Type")))
        return response

    def _partner(self, n: int) -> None:
        subscription = self.subscriptions[n % len(self.subscriptions)]
        with _http() as http:
            while not self.stopped.is_set():
                if n % 2:
                    self._call(http, "GET", "/api/v1/partner/webhooks", 12, headers=self.auth)
                    continue
                response = self._call(http, "POST", f"/api/v1/partner/webhooks/{subscription['id']}/test", 12,
                                      headers=self.auth, json={"secret": subscription["secret"]})
                if response is not None and response.status_code == 202:
                    self.acknowledged.append(response.json()["id"])

    def _health(self) -> None:
        with _http() as http:
            while not self.stopped.wait(0.2):
                self._call(http, "GET", "/healthz", 5)

    def stop(self) -> None:
        self.stopped.set()
        for thread in self.threads:
            thread.join()

    def partner_answers(self, since: float, until: float) -> list[Answer]:
        return [a for a in self.answers if a.path != "/healthz" and since <= a.started_at < until]


def _http() -> requests.Session:
    http = requests.Session()
    http.trust_env = False  # no proxy variables: loopback only
    return http


def test_a_frozen_postgresql_holds_no_thread_answers_every_request_and_loses_nothing(
        own_postgres_server, server_env, smoke_key, session, tmp_path):
    server_env["PARTNER_WEBHOOK_ALLOWED_NETWORKS"] = '["127.0.0.0/8"]'
    receiver = Receiver().start()
    service = Gunicorn(server_env, tmp_path)
    callers = None
    try:
        service.wait_until_serving(session)
        api = service.base_url + "/api/v1/partner/webhooks"
        subscriptions = [session.post(api, json={"url": f"{receiver.url}/{n}"}, headers=bearer(smoke_key),
                                      timeout=5).json() for n in range(4)]
        callers = Callers(service.base_url, smoke_key, subscriptions, CALLERS)
        assert eventually(lambda: len(receiver.received) >= 20, seconds=10)

        own_postgres_server.freeze()
        frozen_at = time.monotonic()
        time.sleep(FREEZE_SECONDS)  # the outage itself: the callers keep calling through it
        thawed_at = time.monotonic()  # before: this thread may wait for the callers' GIL after it
        own_postgres_server.thaw()
        assert eventually(lambda: session.get(api, headers=bearer(smoke_key), timeout=10).status_code == 200,
                          seconds=30)  # back by itself
        callers.stop()

        health = [a for a in callers.answers if a.path == "/healthz"]
        assert all(a.status == 200 and a.seconds < 2 for a in health), \
            max(health, key=lambda a: a.seconds)
        assert len([a for a in health if frozen_at <= a.started_at < thawed_at]) >= FREEZE_SECONDS * 2
        answered = callers.partner_answers(0, float("inf"))
        assert all(a.status is not None and a.seconds < 10 for a in answered), \
            max(answered, key=lambda a: a.seconds)
        during = callers.partner_answers(frozen_at + 2, thawed_at)
        assert len(during) > CALLERS * FREEZE_SECONDS  # many waited, none for long
        assert {a.status for a in during} == {503}, [a for a in during if a.status != 503]
        assert all(a.retry_after == "5" and a.content_type == "application/problem+json" for a in during)

        acknowledged = set(callers.acknowledged)
        assert eventually(lambda: acknowledged <= {r.headers["X-VC-Event-Id"] for r in receiver.received},
                          seconds=60)
        assert service.stop() == 0
        errors = [line for line in service.output()[1].splitlines() if "[ERROR]" in line]
        assert len(errors) == 1, errors
        assert "partner.store.availability: database unavailable (OperationalError: PostgreSQL is not answering)" in errors[0]
    finally:
        own_postgres_server.thaw()
        if callers:
            callers.stop()
        if service.process.poll() is None:
            service.process.kill()
            service.process.wait()
        receiver.stop()
