"""The due backlog, read on a short-lived connection of its own with a hard time bound, so that
readiness and the metrics scrape answer even when the database does not.

What counts as due, ready, held at its limit or held is the queue's rule (partner/queue.py): `due`,
open deliveries whose due time has passed; `ready`, those of them no receiver holds; `at_limit`, the
subscriptions held at their allowance with deliveries due behind them; `paused`, those held.
"""

import logging
import sqlite3
from contextlib import closing
from dataclasses import dataclass

import psycopg2
from peewee import SqliteDatabase

from partner import queue
from partner.store import postgres
from partner.store.backup import file_uri
from partner.store.connection import db
from partner.store.sql import bind, rows_by_name, writer_turn_if_free

log = logging.getLogger(__name__)

# How long the write-lock probe waits for SQLite's lock: it asks whether a write could begin now.
PROBE_LOCK_MS = 100


class DatabaseUnavailable(Exception):
    """The database could not be read within the bound, or refused a write; the message says which."""


@dataclass(frozen=True)
class Backlog:
    due: int
    oldest_due_at: int | None  # Unix ms
    at_limit: int = 0
    paused: int = 0
    writable: bool | None = None  # whether a write could begin (read_backlog); None: not found out
    ready: int = 0  # of `due`, those of subscriptions no receiver holds
    oldest_ready_at: int | None = None

    def oldest_due_seconds(self, now_ms: int) -> float:
        return _age(self.oldest_due_at, now_ms)

    def oldest_ready_seconds(self, now_ms: int) -> float:
        return _age(self.oldest_ready_at, now_ms)


def _age(at_ms: int | None, now_ms: int) -> float:
    return 0.0 if at_ms is None else max(0, now_ms - at_ms) / 1000


def read_backlog(now_ms: int, timeout: float, most: int) -> Backlog:
    """Count due deliveries, and subscriptions held at their limit (`most`: the most attempts in
    flight to one) or paused, and find out whether a write could begin (`writable`), within `timeout`
    seconds: never a write, so that asking (a readiness probe, a scrape, a hammer of either) costs the
    database no commit. Raises DatabaseUnavailable."""
    try:
        connection, p = _connect(db.obj, timeout)
        with closing(connection):
            due = _read(connection, p, queue.DUE, now_ms=now_ms)
            at_limit = _read(connection, p, queue.AT_LIMIT, now_ms=now_ms, most=most)["at_limit"]
            held = _read(connection, p, queue.HELD, now_ms=now_ms)["held"]
            writable = _write_lock_free(connection)
    except (sqlite3.Error, psycopg2.Error) as error:
        # The driver's message may name the database host: it goes to the log, not to the caller.
        log.warning("database check failed: %s", _first_line(error))
        raise DatabaseUnavailable(f"the database could not be read within {timeout:g} s "
                                  f"({type(error).__name__})") from None
    return Backlog(int(due["due"]), _ms(due["oldest"]), int(at_limit), int(held), writable, int(due["ready"]),
                   _ms(due["oldest_ready"]))


def _read(connection, placeholder: str, statement: str, **params) -> dict:
    """The one row `statement` answers, by column name."""
    cursor = connection.cursor()
    cursor.execute(*bind(statement, params, placeholder))
    [row] = rows_by_name(cursor)
    return row


def _ms(value) -> int | None:
    return None if value is None else int(value)


def _write_lock_free(connection) -> bool | None:
    """Whether a write could begin now, found without writing. PostgreSQL: it answered the read,
    and its writes need nothing more. SQLite: BEGIN IMMEDIATE takes the one write lock and ROLLBACK
    lets it go, with nothing written (no page, no -wal frame, no commit for data_version to count),
    and within PROBE_LOCK_MS: a lock held from outside (an operator's shell, a backup tool) fails it.
    Only while no thread of this process writes, and holding its writers off meanwhile: a busy service
    writes back to back, so a probe between its writes would find the lock taken by this very process
    and call it not ready. While one does, None: its commit, or its failure, tells (availability)."""
    if not isinstance(connection, sqlite3.Connection):
        return True
    with writer_turn_if_free() as ours:
        if not ours:
            return None
        connection.execute(f"PRAGMA busy_timeout = {PROBE_LOCK_MS}")
        try:
            connection.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError:  # locked, or a file this process may not write
            return False
        connection.execute("ROLLBACK")
        return True


def _connect(database, timeout: float) -> tuple:
    """A connection of its own to the app's database, every wait on it bounded by `timeout`, and the
    driver's placeholder."""
    if isinstance(database, SqliteDatabase):
        # `timeout` bounds the wait for a lock another connection holds; nothing else here can block.
        # mode=rw: a file that is gone is an error, not a new empty database made by asking.
        return sqlite3.connect(file_uri(database.database, "rw"), uri=True, timeout=timeout,
                               isolation_level=None), "?"
    return psycopg2.connect(**postgres.own_connection(database, timeout)), "%s"


def _first_line(error: Exception) -> str:
    """The driver's first line: no statement parameters, and libpq never echoes a password."""
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
