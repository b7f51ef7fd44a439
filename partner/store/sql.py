"""Database access beside the models: write transactions in turn, hand-written SQL of the hot paths,
keyset pages, and the identifiers rows are stored under."""

import functools
import re
import secrets
import string
import threading
from collections.abc import Mapping
from contextlib import contextmanager

from peewee import OperationalError

from partner.store import availability
from partner.store.availability import is_sqlite
from partner.store.connection import db

_ALPHANUMERIC = string.ascii_letters + string.digits

# SQLite allows one writer. Writers of this process (SQLite is served by one) queue on this lock
# instead of in SQLite's busy handler, which sleeps in steps of 1 to 100 ms and starves a busy
# process. Re-entrant, so write transactions nest.
_SQLITE_WRITER = threading.RLock()
# How long a writer waits for that lock before giving up (503). Unbounded, writers queued behind a
# database locked from outside held every request thread, and a GET waited ~15 s for a free thread
# though it needs no lock; in-process writes hold the lock for milliseconds, so this is only reached
# when the holder itself is stuck in the busy handler.
WRITER_WAIT_SECONDS = 1.0


def random_token(length: int) -> str:
    return "".join(secrets.choice(_ALPHANUMERIC) for _ in range(length))


def new_id(prefix: str) -> str:
    """A random public identifier such as `wh_3kF9...` (119 bits of randomness)."""
    return f"{prefix}_{random_token(20)}"


@contextmanager
def write_transaction(durable: bool = True):
    """A transaction that writes. On SQLite it takes the write lock up front (BEGIN IMMEDIATE):
    a deferred transaction that reads and then writes fails instead of waiting when another
    writer got in between. `durable`: what it writes is acknowledged to someone (an API answer, an
    operator's command), so on SQLite its commit is fsynced (synchronous=FULL) before it returns;
    the delivery engine's own bookkeeping passes False (NORMAL: a power cut may lose it, which can
    only cause a re-send)."""
    with _writer_turn():
        switch = durable and is_sqlite() and db.transaction_depth() == 0  # the outermost's setting
        try:
            if switch:
                db.execute_sql("PRAGMA synchronous = FULL")
            with availability.watch_commit(), db.atomic(*["IMMEDIATE"] if is_sqlite() else []):
                yield
        except OperationalError as error:
            raise _rolled_back_cause(error) from None
        finally:
            if switch:
                db.execute_sql("PRAGMA synchronous = NORMAL")


@contextmanager
def _writer_turn():
    """On SQLite, this thread's turn at the one writer among this process's threads. Nothing to take
    on PostgreSQL."""
    if not is_sqlite():
        yield
        return
    # The connection first: waiting for a pooled one while holding the writer lock would hold up
    # every writer of the process, and those writers hold connections.
    db.connection()
    if not _SQLITE_WRITER.acquire(timeout=WRITER_WAIT_SECONDS):
        raise availability.DatabaseBusy(f"another write held the database for over {WRITER_WAIT_SECONDS} s")
    try:
        yield
    finally:
        _SQLITE_WRITER.release()


@contextmanager
def writer_turn_if_free():
    """This thread's turn at the one SQLite writer if no other thread of this process has it now,
    taken without waiting: yields whether it was free. While it is held, this process's writers wait
    for it (WRITER_WAIT_SECONDS at most)."""
    free = _SQLITE_WRITER.acquire(blocking=False)
    try:
        yield free
    finally:
        if free:
            _SQLITE_WRITER.release()


def _rolled_back_cause(error: OperationalError) -> BaseException:
    """The error to report for a failed SQLite transaction. A commit that fails for want of space
    (or on I/O) is rolled back by SQLite itself; peewee's ROLLBACK after it then fails with "no
    transaction is active", which would hide the cause (and make a full disk look like a bug)."""
    cause = error
    while cause is not None and "no transaction is active" in str(cause):
        cause = cause.__context__
    return cause if isinstance(cause, OperationalError) else error


# A parameter: `:name`, not the second colon of PostgreSQL's `::type` cast, nor inside a word.
_PARAMETER = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")


class ParameterError(Exception):
    """A statement and its parameters do not match: a name it uses is missing, or one given is unused."""


def run_sql(template: str, params: Mapping, **parts: str):
    """Execute a hand-written, portable statement of a hot path. `:name` is a parameter bound from the
    mapping `params` by name (bind); any {name} a fixed SQL part from `parts`."""
    return run_sql_on(db, template.format(**parts) if parts else template, params)


def run_sql_on(database, template: str, params: Mapping):
    """Execute `template` on `database` (a migration's, a copy's: not necessarily the service's), each
    `:name` bound from `params` by name (bind)."""
    return database.execute_sql(*bind(template, params, database.param))


def bind(text: str, params: Mapping, placeholder: str) -> tuple[str, tuple]:
    """`text` with each `:name` replaced by the driver's `placeholder`, and the values in that order.
    A list value is a list of placeholders (`IN (:ids)`), a list of tuples one row of them per tuple
    (`VALUES :rows`). Raises ParameterError for a name used but not given, one given but not used, or
    an empty list (`IN ()` is no SQL)."""
    texts, names = _split(text)
    if missing := set(names) ^ params.keys():
        raise ParameterError(f"parameters {sorted(missing)} are not both used and given")
    out, values = [texts[0]], []
    for name, following in zip(names, texts[1:]):
        value = params[name]
        if not isinstance(value, (list, tuple)):
            out.append(placeholder)
            values.append(value)
        elif not value:
            raise ParameterError(f"parameter {name} is an empty list")
        elif isinstance(value[0], (list, tuple)):
            out.append(", ".join("(" + ", ".join([placeholder] * len(row)) + ")" for row in value))
            values.extend(item for row in value for item in row)
        else:
            out.append(", ".join([placeholder] * len(value)))
            values.extend(value)
        out.append(following)
    return "".join(out), tuple(values)


@functools.lru_cache(maxsize=512)
def _split(text: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The text between parameters, and the parameters' names in order."""
    pieces = _PARAMETER.split(text)
    return tuple(pieces[0::2]), tuple(pieces[1::2])


def select_rows(template: str, params: Mapping, **parts: str) -> list[dict]:
    """run_sql, with each row read by column name (`AS` names it): rows never read by position."""
    return rows_by_name(run_sql(template, params, **parts))


def rows_by_name(cursor) -> list[dict]:
    """The rows a DB-API cursor answers, each by column name."""
    names = [column[0] for column in cursor.description]
    return [dict(zip(names, row)) for row in cursor.fetchall()]


def page_of(rows: list[dict], limit: int, names: list[str]):
    """Split `limit + 1` rows in keyset order into the page and the position that follows it."""
    if len(rows) <= limit:
        return rows, None
    rows = rows[:limit]
    return rows, [rows[-1][name] for name in names]


# A committed write that changes nothing a partner sees: the proof that the database takes writes.
# Beginning a transaction proves nothing: on a full disk SQLite begins one, and fails the commit.
# Its value must differ each time: SQLite skips writing a row rewritten unchanged.
WRITE_PROBE = ("INSERT INTO setting (name, value) VALUES ('write_probe', :value) "
               "ON CONFLICT (name) DO UPDATE SET value = excluded.value")


def probe_write() -> None:
    """Commit WRITE_PROBE; raises what the database raises. While the database is down, this is how a
    process with nothing else to write learns that it takes writes again (availability.watch_commit)."""
    with write_transaction():
        run_sql(WRITE_PROBE, {"value": random_token(16)})
