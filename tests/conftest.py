"""Fixtures: the real app on a temporary SQLite file, with the clock and the resolver injected."""

import ssl
import threading
import time

import pytest
import trustme

from app import create_app
from keys import create_key
from models import db
from tests.contract import ContractClient

ALLOWED_LOOPBACK = ["127.0.0.0/8"]

# Throwaway Redis and PostgreSQL servers (fixtures redis_server, redis_url, postgres_server, postgres_url).
pytest_plugins = ["tests.servers"]


class FakeClock:
    """Wall-clock seconds that only move when a test says so."""

    def __init__(self, start: float | None = None):
        self.now = start if start is not None else time.time()

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class StubResolver:
    """A DNS resolver answering from a dict; names not in it do not resolve. Records every lookup.
    Names in `stalled` get no answer until `released` is set (the fixture sets it at teardown)."""

    def __init__(self, answers: dict[str, list[str]] | None = None):
        self.answers = dict(answers or {})
        self.lookups: list[str] = []
        self.stalled: set[str] = set()
        self.released = threading.Event()

    def __call__(self, host: str) -> list[str]:
        self.lookups.append(host)
        if host in self.stalled:
            self.released.wait(60)
        return list(self.answers.get(host, []))


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def resolver():
    resolver = StubResolver({"hooks.partner.example": ["93.184.215.14"]})
    yield resolver
    resolver.released.set()


@pytest.fixture
def database_url(tmp_path):
    """The database of the test's app; the PostgreSQL test modules override this."""
    return f"sqlite:///{tmp_path}/partner.sqlite3"


@pytest.fixture
def config(request, database_url, clock, resolver):
    """Overrides for create_app; a test adds its own with @pytest.mark.config(NAME=value)."""
    marker = request.node.get_closest_marker("config")
    return {"DATABASE_URL": database_url, "CLOCK": clock,
            "RESOLVER": resolver, "SCHEDULER_ENABLED": False, **(marker.kwargs if marker else {})}


@pytest.fixture
def app(config):
    app = create_app(config)
    app.test_client_class = ContractClient  # every response is checked against openapi.yaml
    return app


@pytest.fixture
def client(app):
    return app.test_client()


@pytest.fixture
def issue_key(app, clock):
    """Issue a key as the operator would; returns the full key."""
    def issue(org: str = "acme", scopes=("webhooks:manage",), rate_limit: int | None = None) -> str:
        with app.app_context(), db.connection_context():
            return create_key(org, list(scopes), int(clock() * 1000), rate_limit).full_key
    return issue


@pytest.fixture
def api_key(issue_key):
    return issue_key()


@pytest.fixture
def auth(api_key):
    return {"Authorization": f"Bearer {api_key}"}


# --- TLS: a throwaway CA, partners' certificates, and the bundle that trusts them -----------------

TLS_HOSTS = ("hooks.example.test", "hooks.partner.example")


@pytest.fixture(scope="session")
def tls_ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="session")
def ca_bundle(tls_ca, tmp_path_factory) -> str:
    """A PEM file trusting the test CA only, as PARTNER_DELIVERY_CA_BUNDLE names it."""
    path = tmp_path_factory.mktemp("tls") / "ca.pem"
    tls_ca.cert_pem.write_to_path(str(path))
    return str(path)


@pytest.fixture(scope="session")
def server_tls(tls_ca) -> ssl.SSLContext:
    """A receiver's TLS context, with a certificate for TLS_HOSTS signed by the test CA."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls_ca.issue_cert(*TLS_HOSTS).configure_cert(context)
    return context
