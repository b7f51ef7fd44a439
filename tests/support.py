"""The tests' one vocabulary: paths, the auth header, the problem assertion, the injected clock and
resolver, and a free loopback port. Fixtures live in conftest.py; receivers in tests/receivers.py."""

import socket
import threading
import time

API = "/api/v1/partner"
ME = f"{API}/me"
WEBHOOKS = f"{API}/webhooks"
PUBLIC_IP = "93.184.215.14"  # answers for names the tests pretend are public; never connected to


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


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (a server retries if it is taken since)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


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
    (the resolver fixture sets it at teardown)."""

    def __init__(self, answers: dict | None = None, default=()):
        self.answers = dict(answers or {})
        self.default = default
        self.lookups: list[str] = []
        self.stalled: set[str] = set()
        self.released = threading.Event()

    def __call__(self, host: str) -> list[str]:
        self.lookups.append(host)
        if host in self.stalled:
            self.released.wait(60)
        answer = self.answers.get(host, self.default)
        if isinstance(answer, Exception):
            raise answer
        return list(answer)
