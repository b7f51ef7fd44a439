"""The one database of a process: binding it (no I/O), and what its first use needs checked.

flaskr's shape: building the app binds `db` to the configured URL and opens nothing; peewee opens a
pooled connection at its first query. The start-up step (partner/startup.py) calls `require_supported`
and, for a new SQLite file, `make_directory`; migrations are partner/store/migrations.
"""

import logging
import os
import sqlite3

from peewee import DatabaseProxy, PostgresqlDatabase
from playhouse.db_url import connect

from partner.store import postgres
from partner.telemetry.logs import QUERY_LOG_FILTER

# WAL lets readers run beside the one writer; the busy timeout makes writers queue, not fail.
# cache_size: 512 KiB of pages per connection instead of SQLite's 2 MiB. Every pooled connection
# keeps its own cache, and in WAL mode any commit empties the others' at their next read, so big
# caches held mostly stale pages: the worker's RSS grew by the connections' 2 MiB each for minutes
# (bench/soak.py). 512 KiB still holds what a claim touches in a million-row history (256 KiB made
# it 10 % slower: bench/state_scale.py); the operating system's page cache holds the rest.
# synchronous=NORMAL here, FULL for the commits acknowledged to someone (sql.write_transaction):
# NORMAL in WAL mode survives an application crash but not a power cut or an OS crash; FULL fsyncs
# the commit before it returns, so a 202, a 201 whose secret the partner stored or a revoked key
# survives those too. The delivery engine's bookkeeping stays NORMAL: losing it only causes a re-send.
SQLITE_PRAGMAS = {"journal_mode": "wal", "busy_timeout": 5000, "foreign_keys": 1,
                  "synchronous": "normal", "cache_size": -512}
# Connections are pooled: opening one (and, on SQLite, running the pragmas) per request or per
# delivery attempt costs more than the query. `timeout`: seconds to wait for a free connection.
POOLED_SCHEMES = {"sqlite", "postgres", "postgresql"}
POOL = {"max_connections": 64, "stale_timeout": 300, "timeout": 10}
# Recording the successes of a batch is one `UPDATE … RETURNING`, and a claim reads its candidates
# once from `MATERIALIZED` queries (partner/claims.py): SQLite has both since 3.35.0, PostgreSQL
# since 12.
SQLITE_FLOOR, POSTGRESQL_FLOOR = (3, 35, 0), (12,)

db = DatabaseProxy()


def bind(url: str):
    """Bind `db` to the database at `url` (a playhouse.db_url URL) and return it; opens nothing.
    One database per process: a second call re-binds every model."""
    scheme, rest = url.split("://", 1)
    logging.getLogger("peewee").addFilter(QUERY_LOG_FILTER)  # idempotent: one filter instance
    params = dict(POOL)
    if scheme.startswith("sqlite"):
        # A pooled connection moves between threads, though only one uses it at a time.
        params.update(pragmas=SQLITE_PRAGMAS, check_same_thread=False)
    if scheme in POOLED_SCHEMES:
        url = f"{scheme}+pool://{rest}"
    database = connect(url, **params)
    if isinstance(database, PostgresqlDatabase):
        postgres.bound(database)
    db.initialize(database)
    return database


def sqlite_file(url: str) -> str | None:
    """The file of a sqlite:/// URL (relative or absolute), None for PostgreSQL or `:memory:`."""
    scheme, rest = url.split("://", 1)
    path = rest[1:].split("?", 1)[0]
    return os.path.abspath(path) if scheme.startswith("sqlite") and path and path != ":memory:" else None


def make_directory(url: str) -> None:
    """The directory of a SQLite file, so that its first connection can make the file."""
    path = sqlite_file(url)
    if path:
        os.makedirs(os.path.dirname(path), exist_ok=True)


class DatabaseTooOld(RuntimeError):
    """A SQLite or PostgreSQL older than the code needs."""


def require_supported(database, sqlite_version: tuple[int, ...] = sqlite3.sqlite_version_info) -> None:
    """Refuse a database older than its floor (PostgreSQL's version is known once connected: this
    reads it). `sqlite_version`: the library's."""
    if isinstance(database, PostgresqlDatabase):
        with database.connection_context():
            require_version("PostgreSQL", postgresql_version(database.server_version), POSTGRESQL_FLOOR)
    else:
        require_version("SQLite", sqlite_version, SQLITE_FLOOR)


def require_version(product: str, version: tuple[int, ...], floor: tuple[int, ...]) -> None:
    """Refuse, in one line naming both versions, a database older than its floor."""
    if tuple(version) < floor:
        raise DatabaseTooOld(f"{product} {_dotted(version)} found; the service needs {product} {_dotted(floor)} "
                             "or newer (UPDATE … RETURNING, MATERIALIZED)")


def postgresql_version(number: int) -> tuple[int, ...]:
    """psycopg2's server_version (150004, or 90605 before 10) as (15, 4), or (9, 6, 5)."""
    major, rest = divmod(number, 10000)
    return (major, rest) if major >= 10 else (major, rest // 100, rest % 100)


def _dotted(version: tuple[int, ...]) -> str:
    return ".".join(map(str, version))
