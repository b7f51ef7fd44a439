"""Fixtures: the real app on a temporary SQLite file, with the clock and the resolver injected."""

import json
import os
import shutil
import ssl
import threading

import pytest
import trustme

from partner.event_types import add_event_type
from partner.keys import create_key
from partner.publishers import create_publisher
from models import db
from partner import sealing
from partner.store.connection import SQLITE_PRAGMAS, sqlite_file
from tests.contract import ContractClient
from tests.receivers import KeepAlivePorts, RawServer, Receiver
from tests.support import (ENCRYPTION_KEYS, EVENTS, LEAD_SCHEMA, started_app, PUBLIC_IP, WEBHOOKS, FakeClock,
                           StubResolver, bearer, json_of)

ALLOWED_LOOPBACK = ["127.0.0.0/8"]

# Every app the suite builds, in this process or another, seals with the suite's key.
os.environ["PARTNER_ENCRYPTION_KEYS"] = json.dumps(ENCRYPTION_KEYS)

# Throwaway Redis, PostgreSQL and Prometheus servers (fixtures redis_server, redis_url, postgres_server,
# postgres_url, start_prometheus), and a real gunicorn (gunicorn, server_env).
pytest_plugins = ["tests.servers", "tests.gunicorn_server", "tests.prometheus_server"]


@pytest.fixture(autouse=True)
def keyring():
    """The suite's keys, loaded as create_app loads them, for tests that open the database directly."""
    sealing.use(sealing.keyring_of(ENCRYPTION_KEYS))


@pytest.fixture
def clock(request):
    """The service clock; it starts at the test module's CLOCK_START (Unix seconds) if it has one."""
    return FakeClock(getattr(request.module, "CLOCK_START", None))


@pytest.fixture
def brief_busy_timeout(request, monkeypatch):
    """SQLite's busy timeout (5 s in the product) at 200 ms, or the milliseconds a test parametrizes
    it with (indirect), for tests of a file locked from outside: each write they try waits it out.
    Ask for it before the app (connections take it when opened)."""
    monkeypatch.setitem(SQLITE_PRAGMAS, "busy_timeout", getattr(request, "param", 200))


@pytest.fixture
def resolver():
    resolver = StubResolver({"hooks.partner.example": [PUBLIC_IP]})
    yield resolver
    resolver.released.set()


BACKENDS = ("sqlite", "postgresql")


def pytest_generate_tests(metafunc):
    """`@pytest.mark.both_databases` (on a test, a class or a module) runs a test on each backend."""
    if metafunc.definition.get_closest_marker("both_databases") and "backend" in metafunc.fixturenames:
        metafunc.parametrize("backend", BACKENDS, indirect=True)


# Fixtures that start a real server process: a test that uses one (or runs on PostgreSQL or Redis)
# is marked `servers`, and `make test-fast` leaves it out. A fixture that asks for a server only
# while it runs (request.getfixturevalue) is not among the test's fixture names: a parameter naming
# the server (the backend's, a database_url's, a config's) or the module says so instead, and
# servers.py refuses to hand a server to a test left unmarked.
SERVER_FIXTURES = {"postgres_server", "own_postgres_server", "redis_server", "server_env", "gunicorn",
                   "start_prometheus"}
SERVER_PARAMS = {"postgresql", "redis"}
SERVER_MODULES = {"test_api_live", "test_disk_full", "test_postgres"}  # a browser, a tmpfs, PostgreSQL throughout


def pytest_collection_modifyitems(items):
    for item in items:
        params = item.callspec.params.values() if hasattr(item, "callspec") else ()
        if (any(isinstance(param, str) and param in SERVER_PARAMS for param in params)
                or SERVER_FIXTURES & set(item.fixturenames) or item.module.__name__.split(".")[-1] in SERVER_MODULES):
            item.add_marker("servers")


@pytest.fixture
def backend(request):
    """The database behind the test's app: SQLite unless the test is marked both_databases."""
    return getattr(request, "param", "sqlite")


@pytest.fixture
def database_url(request, backend, tmp_path):
    """A fresh database for the test: a SQLite file, or an empty PostgreSQL schema of its own."""
    if backend == "postgresql":
        return request.getfixturevalue("postgres_url")
    return f"sqlite:///{tmp_path}/partner.sqlite3"


@pytest.fixture
def config(request, database_url, clock, resolver):
    """Overrides for create_app; a test adds its own with @pytest.mark.config(NAME=value)."""
    marker = request.node.get_closest_marker("config")
    return {"DATABASE_URL": database_url, "CLOCK": clock,
            "RESOLVER": resolver, "SCHEDULER_ENABLED": False, **(marker.kwargs if marker else {})}


@pytest.fixture(scope="session")
def migrated_sqlite(tmp_path_factory) -> str:
    """A SQLite file migrated once for the session: a test's app starts on a copy of it, since
    migrating takes half of building an app. test_migrations migrates from nothing itself."""
    path = tmp_path_factory.mktemp("migrated") / "partner.sqlite3"
    started_app({"DATABASE_URL": f"sqlite:///{path}", "SCHEDULER_ENABLED": False})
    return str(path)


@pytest.fixture
def app(config, migrated_sqlite):
    path = sqlite_file(config["DATABASE_URL"])
    if path and not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        shutil.copyfile(migrated_sqlite, path)
    app = started_app(config)
    app.test_client_class = ContractClient  # every response is checked against openapi.yaml
    return app


@pytest.fixture
def database(app):
    """The app's database, connected, inside its app context: for tests that call the domain directly."""
    with app.app_context(), db.connection_context():
        yield db


@pytest.fixture
def organization(database, clock):
    """organization("a") creates an organization with its key; returns its id."""
    return lambda slug: create_key(slug, ["webhooks:manage"], int(clock() * 1000)).key.organization.id


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
    return bearer(api_key)


# --- the partner's calls, as the API key `auth` makes them ---------------------------------------

@pytest.fixture
def subscribe(client, auth):
    """subscribe(url): create a subscription (201) and return its JSON, secret included."""
    def subscribe(url: str) -> dict:
        return json_of(client.post(WEBHOOKS, json={"url": url}, headers=auth), 201)
    return subscribe


@pytest.fixture
def ping(client, auth):
    """ping(subscription): POST its test trigger; the response, whatever its status."""
    def ping(subscription: dict):
        return client.post(f"{WEBHOOKS}/{subscription['id']}/test",
                           json={"secret": subscription["secret"]}, headers=auth)
    return ping


@pytest.fixture
def failures(client, auth):
    """failures(subscription, limit=..., cursor=...): its failures audit page (200) as JSON."""
    def failures(subscription: dict, **query) -> dict:
        return json_of(client.get(f"{WEBHOOKS}/{subscription['id']}/failures", query_string=query,
                                  headers=auth), 200)
    return failures


# --- the platform's publishers ----------------------------------------------------------------------

@pytest.fixture
def registered(app, clock):
    """register(name, schema=None): an event type the operator added."""
    def register(name: str, schema: dict | None = None) -> None:
        with app.app_context(), db.connection_context():
            add_event_type(name, f"About {name}.", None if schema is None else json.dumps(schema), int(clock() * 1000))
    for name, schema in (("lead.created", LEAD_SCHEMA), ("lead.note.added", None), ("intake.done", None)):
        register(name, schema)
    return register


@pytest.fixture
def credential(app, clock, registered) -> str:
    with app.app_context(), db.connection_context():
        return create_publisher("billing", int(clock() * 1000)).credential


@pytest.fixture
def publish(client, credential):
    """publish(body, key=None, path=EVENTS): the response to a publish as the `billing` publisher."""
    def publish(body, key: str | None = None, path: str = EVENTS, credential: str = credential):
        headers = {**bearer(credential), **({"Idempotency-Key": key} if key is not None else {})}
        return client.post(path, json=body, headers=headers)
    return publish


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


@pytest.fixture
def serve_raw():
    """Start RawServers (tests/receivers.py): serve_raw(behave, tls=None); all stop at teardown."""
    servers: list[tuple[RawServer, threading.Thread]] = []

    def start(behave, tls: ssl.SSLContext | None = None) -> RawServer:
        server = RawServer(behave)
        if tls is not None:  # handshake on the handler's first recv
            server.listener = tls.wrap_socket(server.listener, server_side=True, do_handshake_on_connect=False)
        thread = threading.Thread(target=server.serve, daemon=True)
        thread.start()
        servers.append((server, thread))
        return server

    yield start
    for server, thread in servers:
        server.stopped.set()
        thread.join(timeout=2)
        server.listener.close()


@pytest.fixture
def start_receiver():
    """Start Receivers (tests/receivers.py): start_receiver(script=[500, 200]); all stop at teardown."""
    started: list[Receiver] = []

    def start(**options) -> Receiver:
        started.append(Receiver(**options).start())
        return started[-1]

    yield start
    for receiver in started:
        receiver.stop()


@pytest.fixture
def keep_alive_ports():
    """Start KeepAlivePorts (tests/receivers.py): keep_alive_ports(count, delay=0.5); all stop at teardown."""
    started: list[KeepAlivePorts] = []

    def start(*args, **options) -> KeepAlivePorts:
        started.append(KeepAlivePorts(*args, **options))
        return started[-1]

    yield start
    for ports in started:
        ports.stop()


@pytest.fixture
def receiver(start_receiver) -> Receiver:
    """A healthy receiver: 200 to every delivery."""
    return start_receiver()


@pytest.fixture
def dispatcher(app):
    """The app's dispatcher; a test may start its scanner, and it is stopped afterwards."""
    dispatcher = app.extensions["delivery"]
    yield dispatcher
    dispatcher.stop()
