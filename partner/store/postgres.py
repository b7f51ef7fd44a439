"""Every wait on PostgreSQL bounded: connecting, each statement, an idle socket, and a server that
takes the bytes and never answers.

The server bounds what it runs (SERVER: a statement, a lock wait, a transaction left idle) and the
kernel bounds a socket whose peer is gone (LIBPQ: keepalives for an idle one, tcp_user_timeout for
data never acknowledged). Neither ends the wait on a server that is alive to the kernel and does
nothing (stopped with SIGSTOP, swapped out, wedged): the kernel acknowledges every byte, so no
keepalive fails, and no statement timeout fires in a process that does not run. Only the client can
end that wait, so this process waits on its own clock:

- libpq waits in poll() on a socket it keeps non-blocking, so a receive timeout on the socket
  (SO_RCVTIMEO, set through socket.fromfd) would never be consulted. psycopg2's wait callback
  (`set_wait_callback`) is the one place every wait of every connection goes through (connecting,
  each statement, each COMMIT): `_wait` does the waiting, on a Connection's bound: its set-up within
  libpq's `connect_timeout` (which libpq leaves to the application once it does not wait itself),
  each later wait within ANSWER_SECONDS. A connection made another way (a tool's, a test's) waits as
  libpq would.
- A bound per wait is not enough: gunicorn's threads would all sit out their ANSWER_SECONDS, and
  /healthz, which needs no database, would find none free. So a wait that has heard nothing for
  QUIET_SECONDS, while nothing else of the database heard anything either, has a probe thread open
  a connection of its own; if that is not answered within PROBE_SECONDS the server is `silent`:
  every wait gives up at once (NotAnswering) and none begins, not even a TCP connection, until the
  probe, retried every PROBE_PAUSE_SECONDS, is answered. peewee's pool opens connections and checks
  them out under a lock of its own: a wait there holds every thread that wants a connection, which
  is why waits end on the probe's word rather than each on its own bound.

A failed wait closes its connection (psycopg2 does, since its state is unknown) and raises
NotAnswering, an OperationalError: partner.store.availability counts it as the database being
unavailable (503 with Retry-After, deliveries wait), never as a bug.
"""

import functools
import os
import select
import threading
import time

import psycopg2
from psycopg2 import extensions

# libpq's keywords: the connection's set-up; an idle socket checked after 30 s and given up 30 s
# later (a pooled connection to a host that vanished); bytes unacknowledged for 10 s (a cable pulled
# mid-statement). An operator's own value in the URL is kept.
LIBPQ = {"connect_timeout": 3, "keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10,
         "keepalives_count": 3, "tcp_user_timeout": 10_000}
# What the server enforces in each session. The service's statements take milliseconds; a lock is
# held for one short transaction. An answer past these is a 503 to retry, not a request held.
SERVER = {"statement_timeout": "5s", "lock_timeout": "2s", "idle_in_transaction_session_timeout": "30s"}
# The client's own bound on one wait: a second past the statement timeout, so a slow statement is
# ended by the server (the connection survives), and only a server that does not run is by us.
ANSWER_SECONDS = 6.0
QUIET_SECONDS, PROBE_SECONDS, PROBE_PAUSE_SECONDS = 0.25, 0.75, 0.5
# The pool's wait for a free connection (peewee's `timeout`): a request is answered within 10 s.
POOL_WAIT_SECONDS = 2
_SLICE_MS = 100  # how often a wait looks up whether the probe found the server silent

NOT_ANSWERING = "PostgreSQL is not answering"


class NotAnswering(psycopg2.OperationalError):
    """A wait on PostgreSQL ended by this process: the server did not answer in time."""


def bound(database) -> None:
    """Bound every wait of `database` (a pooled peewee PostgresqlDatabase, not connected yet)."""
    params = database.connect_params
    for keyword, value in LIBPQ.items():
        params.setdefault(keyword, value)
    # Ours first: a `-c` given later, in the URL's own options, wins.
    params["options"] = " ".join([*(f"-c {name}={value}" for name, value in SERVER.items()),
                                  params.get("options", "")]).strip()
    silence = _Silence(dict(params, dbname=database.database))
    params["connection_factory"] = functools.partial(Connection, silence=silence,
                                                     connect_within=float(params["connect_timeout"]))
    database._wait_timeout = POOL_WAIT_SECONDS  # peewee's pool has no public setter for it
    extensions.set_wait_callback(_wait)


def own_connection(database, within: float | None, steadfast: bool = False) -> dict:
    """psycopg2.connect's keywords for a connection of its own to `database` (bound() first): each
    wait and each statement ends within `within` seconds (None: no bound); `steadfast`, it waits out
    a silence too."""
    params = dict(database.connect_params, dbname=database.database)
    statement_ms = 0 if within is None else int(within * 1000)
    params["options"] = f"{params.get('options', '')} -c statement_timeout={statement_ms}".strip()
    params["connection_factory"] = functools.partial(params["connection_factory"], within=within,
                                                     steadfast=steadfast)
    return params


def unbounded(database):
    """A database of its own beside `database` whose statements and waits have no time bound, for
    migrations: DDL on a large table, and the lock another process holds while it migrates, take
    what they take. Its sockets keep their keepalives."""
    from peewee import PostgresqlDatabase  # noqa: PLC0415 - only where migrations run
    if "connection_factory" not in database.connect_params:  # not bound(): its waits are libpq's own
        return database
    params = own_connection(database, None, steadfast=True)
    params["options"] += " -c lock_timeout=0 -c idle_in_transaction_session_timeout=0"
    return PostgresqlDatabase(params.pop("dbname"), **params)


class Connection(extensions.connection):
    """A psycopg2 connection whose set-up ends after `connect_within` seconds (libpq's own
    connect_timeout, which libpq leaves to the application when it does not wait itself), each later
    wait after `within` seconds (None: no bound), and every wait at once while its server is
    `silence`d, unless it is `steadfast` (the probe; migrations)."""

    def __init__(self, dsn, *args, silence: "_Silence", connect_within: float,
                 within: float | None = ANSWER_SECONDS, steadfast: bool = False):
        if silence.silent and not steadfast:
            # Not even the TCP connection: a stopped server's kernel queues it, and the server,
            # once it runs again, would set up every one queued before the one that is waited on.
            raise NotAnswering(NOT_ANSWERING)
        # Read by _wait while the base class connects.
        self.silence, self.within, self.steadfast = silence, within, steadfast
        self.bound = connect_within if within is None else min(connect_within, within)
        try:
            super().__init__(dsn, *args)
        except NotAnswering:
            raise
        except psycopg2.OperationalError as error:
            raise _naming_the_server(error, dsn) from None
        self.bound = within

    def cut_short(self, waiting_since: float) -> bool:
        """Whether a wait since `waiting_since` ends now."""
        return (self.silence.silent and not self.steadfast) or \
            (self.bound is not None and time.monotonic() - waiting_since >= self.bound)


def _naming_the_server(error: psycopg2.OperationalError, dsn: str) -> psycopg2.OperationalError:
    """The failure to connect as libpq words it when it waits itself (as a start-up refusal shows
    it): it names the server then, and not when the application waits."""
    params = extensions.parse_dsn(dsn)
    host, port = params.get("host", ""), params.get("port", 5432)
    if str(error).startswith("connection to server") or not host or host.startswith("/"):  # a socket's path
        return error
    return psycopg2.OperationalError(f'connection to server at "{host}", port {port} failed: {error}')


class _Silence:
    """Whether a server has stopped answering, as this process finds out without waiting on it with
    more than one thread."""

    def __init__(self, target: dict):
        self.target = target  # psycopg2.connect's keywords for the probe
        self._forget()
        # A probe thread does not survive a fork (gunicorn's workers): a worker starts unknowing.
        os.register_at_fork(after_in_child=self._forget)

    def _forget(self) -> None:
        self._lock = threading.Lock()
        self.heard_at = time.monotonic()  # the last answer any wait had
        self.silent = False
        self._probing = False

    def heard(self) -> None:
        self.heard_at = time.monotonic()

    def suspect(self, waiting_since: float) -> None:
        """A wait since `waiting_since` has heard nothing, nor has any other: probe, unless a probe
        is under way already."""
        if self._probing or time.monotonic() - max(waiting_since, self.heard_at) < QUIET_SECONDS:
            return
        with self._lock:
            if self._probing:
                return
            self._probing = True
        threading.Thread(target=self._probe, name="postgresql-probe", daemon=True).start()

    def _probe(self) -> None:
        try:
            while not self._answers():
                self.silent = True
                time.sleep(PROBE_PAUSE_SECONDS)
        finally:
            with self._lock:
                self.silent = self._probing = False

    def _answers(self) -> bool:
        """Whether the server answers a new connection within PROBE_SECONDS. An error is an answer
        too: a refused connection or "too many clients" hold no thread."""
        factory = functools.partial(Connection, silence=self, connect_within=PROBE_SECONDS, within=PROBE_SECONDS,
                                    steadfast=True)
        try:
            connection = psycopg2.connect(**self.target, connection_factory=factory)
            try:
                connection.cursor().execute("SELECT 1")
            finally:
                connection.close()
        except NotAnswering:
            return False
        except psycopg2.Error:
            pass
        return True


def _wait(connection) -> None:
    """psycopg2's wait callback: the process's connections are non-blocking, and their waits are made
    here, a Connection's bounded. libpq is polled again only once its socket is ready: polled early,
    a connection still being set up would send on a socket not yet connected, and fail."""
    own = isinstance(connection, Connection)
    started = time.monotonic()
    if own and connection.cut_short(started):  # libpq sends nothing more to a server that reads nothing
        raise NotAnswering(NOT_ANSWERING)
    poller = select.poll()
    state = connection.poll()
    while state != extensions.POLL_OK:
        reading = state == extensions.POLL_READ
        poller.register(connection.fileno(), select.POLLIN if reading else select.POLLOUT)
        while not poller.poll(_SLICE_MS if own else None):
            if connection.cut_short(started):
                raise NotAnswering(NOT_ANSWERING)
            connection.silence.suspect(started)
        if own and reading:  # bytes from the server (a long result comes in many): it runs
            connection.silence.heard()
        state = connection.poll()
    if own:
        connection.silence.heard()
