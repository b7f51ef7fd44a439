"""Whether the database (or the rate-limit storage) can answer now, decided in one place.

An outage is logged as an operator wants to read it: one ERROR when it starts failing (or fails in a
new way), one line when it works again, and nothing per request or per poll between. The database's
outage ends when a write commits (`watch_commit`), or when a probe that writes nothing goes through
(`probe_answered`: /readyz and the scrape ask for one), so that it ends by itself
with or without a scheduler. Not when a partner's read answers: reads go on through a full disk or a
lock held from outside.
"""

import logging
import threading
import time
from contextlib import contextmanager

import psycopg2
from peewee import InterfaceError, OperationalError, SqliteDatabase
from playhouse.pool import MaxConnectionsExceeded

from partner.store.connection import db


def open_hint(url: str) -> str:
    """What to check, on the database's own backend, when the database at `url` cannot be opened."""
    if url.startswith("sqlite"):
        return ("SQLite: its folder must exist, writable by the service's user, with free room for the "
                "-wal and -shm files")
    return ("PostgreSQL: check that the server is up, reachable from this host, and takes the URL's user "
            "and password")


def describe(error: BaseException) -> str:
    """The failure's type and the first line of its message: equal for repeats of one failure."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


class Outage:
    """The state of one dependency (the database, the rate-limit storage) as seen by this process."""

    def __init__(self, log: logging.Logger, what: str, consequence: str, each_failure: bool = True):
        """`each_failure`: log a failure of a new kind during an outage too, not only its start."""
        self._log, self._what, self._consequence = log, what, consequence
        self._each_failure = each_failure
        self._lock = threading.Lock()
        self._failure: str | None = None
        self._started_at = 0.0
        self._count = 0

    @property
    def active(self) -> bool:
        return self._failure is not None

    @property
    def failure(self) -> str | None:
        """What the dependency failed with (`describe`), while it is failing."""
        return self._failure

    def failed(self, error: BaseException) -> None:
        """Count one failure; log it only if the dependency was working or failed differently."""
        failure = describe(error)
        with self._lock:
            self._count += 1
            if failure == self._failure or (self._failure and not self._each_failure):
                return
            if self._failure is None:
                self._started_at = time.monotonic()
            self._failure = failure
        self._log.error("%s unavailable (%s): %s until it answers again", self._what, failure,
                        self._consequence)

    def recovered(self) -> None:
        """The dependency answered: log the end of the outage, if there was one."""
        if self._failure is None:  # the common case, without taking the lock
            return
        with self._lock:
            if self._failure is None:
                return
            seconds, count = time.monotonic() - self._started_at, self._count
            self._failure, self._count = None, 0
        self._log.warning("%s answers again after %.1f s (%d failures meanwhile)", self._what, seconds,
                          count)


log = logging.getLogger(__name__)
# This process's view of the database's availability, shared by the request path and the scanner.
database_outage = Outage(log, "database", "requests answer 503 and deliveries wait")

# SQLite's messages for a database that cannot answer or write now (not for a bug in a statement).
_SQLITE_UNAVAILABLE = ("locked", "busy", "full", "disk i/o", "unable to open", "readonly")


class DatabaseBusy(OperationalError):
    """The in-process SQLite writer lock was not free within its bound."""


def is_unavailable(error: BaseException) -> bool:
    """Whether `error` means the database cannot answer or write right now (down, full, locked),
    so the operation may succeed later, as opposed to a bug."""
    if isinstance(error, MaxConnectionsExceeded):
        return True
    if isinstance(error, InterfaceError):
        # peewee's own InterfaceError is a programming error; psycopg2's (wrapped by peewee, which
        # keeps the driver's as `orig`) is a connection that closed under us.
        return isinstance(getattr(error, "orig", None), psycopg2.InterfaceError)
    if not isinstance(error, OperationalError):
        return False
    if isinstance(error, DatabaseBusy) or not is_sqlite():
        return True  # psycopg2's OperationalError is the connection's or the server's, never the SQL's
    return any(word in str(error).lower() for word in _SQLITE_UNAVAILABLE)


def is_conflict(error: BaseException) -> bool:
    """Whether PostgreSQL rolled the transaction back to end a deadlock (or a serialization failure):
    the database answers, and the same work may succeed at once."""
    return isinstance(getattr(error, "orig", None), psycopg2.extensions.TransactionRollbackError)


def database_failed(error: BaseException) -> None:
    """The database could not answer or write: note the outage, and drop the pool's idle
    connections (after a restart they point at a server that is gone). A conflict is no outage."""
    if is_conflict(error):
        log.warning("transaction rolled back by the database, nothing changed (%s)", describe(error))
        return
    database_outage.failed(_failure_behind(error))
    close_idle = getattr(db.obj, "close_idle", None)
    if close_idle:
        close_idle()


def _failure_behind(error: BaseException) -> BaseException:
    """The failure that `error` stands for. A failed wait on PostgreSQL closes its connection, and
    the ROLLBACK that follows fails with "connection already closed" (InterfaceError): the outage is
    the first failure, not the second."""
    cause = error.__context__ if isinstance(error, InterfaceError) else None
    while cause is not None and not (isinstance(cause, OperationalError) and is_unavailable(cause)):
        cause = cause.__context__
    return cause or error


# Failures a probe that writes nothing cannot disprove: SQLite begins a transaction on a full disk
# (the commit fails), PostgreSQL answers reads. Only a committed write ends these (watch_commit).
_ENDED_BY_A_COMMIT = ("full", "space", "disk i/o")


def probe_answered() -> None:
    """A probe that writes nothing went through (PostgreSQL answered; SQLite's write lock was had and
    let go): end the database's outage, unless only a commit can prove it over."""
    failure = database_outage.failure
    if failure and not any(word in failure.lower() for word in _ENDED_BY_A_COMMIT):
        database_outage.recovered()


@contextmanager
def watch_commit():
    """Wrap one outermost write transaction (outside its BEGIN and COMMIT): once it has committed,
    a database outage ends. On SQLite only if it wrote: a commit with nothing to write succeeds on a
    full disk. On PostgreSQL any commit: its outages are a server that does not answer."""
    if not database_outage.active or db.transaction_depth() > 0:
        yield
        return
    before = _changes()
    yield
    if before is None or _changes() != before:
        database_outage.recovered()


def _changes() -> int | None:
    return db.connection().total_changes if is_sqlite() else None


def is_sqlite() -> bool:
    return isinstance(db.obj, SqliteDatabase)
