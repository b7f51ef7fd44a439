"""Schema versions. Numbered migrations live beside this file (`NNNN_name.py`, each an
`up(migrator, db)`) and are run by peewee's own runner (playhouse.migrations) with its schema
migrator (playhouse.migrate), which rebuilds SQLite tables where ALTER TABLE cannot. The runner's
history table records each applied migration; a database's version is the number of its last one.

A database with no history is either empty (it gets schema.sql, the whole current schema in one
step, and every migration is recorded as applied) or was made by release 1.0 or 1.1 before
versions existed (every migration runs, starting with 0001_baseline). What is written here adds
to peewee only the locking (one process migrates at a time, the others wait and find nothing left)
and the scrub after a migration that removes secrets, owed until it is done.
"""

import itertools
import logging
import secrets
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from peewee import OperationalError, PostgresqlDatabase
from playhouse.migrations import Runner

from partner.store import postgres
from partner.store.sql import run_sql_on

DIRECTORY = Path(__file__).parent
SCHEMA_PATH = DIRECTORY.parents[2] / "schema.sql"
HISTORY_TABLE = "schema_migration"
BASELINE_TABLE = "organization"  # present in every database any release made
# Any constant: the PostgreSQL advisory lock held by the one process that migrates.
MIGRATION_LOCK_ID = 0x7061727472
# PostgreSQL: how long a migration waits for a table lock before it backs off and tries again.
# Below the server's deadlock_timeout (1 s), so a migration that would deadlock with a running
# service's transaction always gives way first: the service's transaction is never the one cancelled.
LOCK_TIMEOUT = "200ms"
LOCK_RETRIES = 50
# SQLite: the pause before trying the write lock again, after a busy timeout spent waiting for it.
SQLITE_LOCK_PAUSE = 0.1
# The `setting` that says a scrub is owed, valued with the migrations that owe it: written in their
# transaction, deleted only once the scrub is done. One cut short (a full disk, a crash, a kill)
# runs again at the next start or `flask db upgrade`: their COMMIT leaves nothing else pending.
SCRUB_OWED = "scrub_owed"
CURSOR_KEY = "cursor_signing_key"  # the `setting` holding the key that seals cursors

log = logging.getLogger(__name__)


class SchemaTooNew(Exception):
    """The database was written by a newer release of the service than this code."""


@dataclass
class SchemaStatus:
    version: int  # the last migration applied; 0 before any
    latest: int  # the code's last migration
    pending: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)  # applied, but not in this code: a newer release
    empty: bool = False
    scrub_owed: list[str] = field(default_factory=list)  # applied, but their scrub is not done

    @property
    def is_newer(self) -> bool:
        return bool(self.unknown)

    @property
    def is_up_to_date(self) -> bool:
        return not self.pending and not self.scrub_owed

    def refusal(self) -> str:
        return (f"the database's schema is version {self.version}, newer than this code's "
                f"{self.latest} ({', '.join(self.unknown)}): run the newer release, or restore a "
                f"backup taken before the upgrade")


def runner(database) -> Runner:
    return Runner(database, str(DIRECTORY), table_name=HISTORY_TABLE)


def number(name: str) -> int:
    return int(name.split("_", 1)[0])


def names() -> list[str]:
    """The code's migrations, in order."""
    return sorted(path.stem for path in DIRECTORY.glob("[0-9]*.py"))


def status(database) -> SchemaStatus:
    """Where the database stands against the code: plain reads, no lock, nothing written."""
    known = names()
    applied = set(runner(database).applied())
    unknown = sorted(applied - set(known), key=number)
    empty = not applied and not database.table_exists(BASELINE_TABLE)
    return SchemaStatus(version=max(map(number, applied), default=0), latest=number(known[-1]),
                        pending=[name for name in known if name not in applied], unknown=unknown,
                        empty=empty, scrub_owed=[] if empty else _scrub_owed(database))


def status_of_nothing() -> SchemaStatus:
    """The status of a database not made yet (a SQLite file that does not exist)."""
    known = names()
    return SchemaStatus(version=0, latest=number(known[-1]), pending=known, empty=True)


def add_cursor_key(database) -> None:
    """The service's key for sealing cursors (partner/edge/pagination.py), made with the schema so that
    a later start, which may find an operator's shell holding the write lock, has nothing to write."""
    run_sql_on(database, "INSERT INTO setting (name, value) VALUES (:name, :value) ON CONFLICT (name) DO NOTHING",
               {"name": CURSOR_KEY, "value": secrets.token_hex(32)})


def upgrade(database) -> list[str]:
    """Apply pending migrations, then any scrub owed, one process at a time; the names applied (none
    when up to date: then no DDL runs and no database lock is taken). Raises SchemaTooNew, having
    written nothing.

    Another process's migrations are waited for as long as they take: on a large file the migrations
    and the scrub take minutes, and a start that gave up would stop the service. PostgreSQL's advisory
    lock waits without a bound; on SQLite the write lock is tried again after each busy timeout (the
    first connection to a new file switches it to WAL, which fails at once while another process is
    doing the same), saying once in the log what it waits for."""
    if isinstance(database, PostgresqlDatabase):  # a migration, or another's lock on it, takes what it takes
        database = postgres.unbounded(database)
    waited = False
    while True:
        try:
            with database.connection_context():
                return _upgrade(database)
        except OperationalError as error:
            if isinstance(database, PostgresqlDatabase) or str(error) != "database is locked":  # SQLite's own
                raise
            if not waited:
                log.warning("migrations wait for the database's write lock, held by another process")
                waited = True
            time.sleep(SQLITE_LOCK_PAUSE)


def _upgrade(database) -> list[str]:
    before = _check(status(database))
    if before.is_up_to_date:
        return []
    with _migration_lock(database):
        locked = _on_postgresql if isinstance(database, PostgresqlDatabase) else _on_sqlite
        applied = locked(database, lambda: _apply(database)) if before.pending else []
        if _scrub_owed(database):
            scrub(database)
    return applied


def scrub(database) -> None:
    """Rewrite the database so that nothing a migration removed stays readable in freed pages: a
    removed row's bytes stay in the file (and SQLite's -wal) until overwritten. SQLite: VACUUM
    rebuilds the file, a TRUNCATE checkpoint empties the -wal (which a reader in another process
    prevents: then it raises). PostgreSQL: VACUUM FULL rewrites the tables (a dropped column's
    values stay in the old row versions otherwise). Only then is the scrub no longer owed. Outside
    any transaction: VACUUM cannot run in one."""
    if isinstance(database, PostgresqlDatabase):
        database.execute_sql("VACUUM FULL subscription")
    else:
        database.execute_sql("VACUUM")
        busy, _, _ = database.execute_sql("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        if busy:
            raise OperationalError("database is locked: a reader in another process kept the scrub "
                                   "from emptying the -wal")
    run_sql_on(database, "DELETE FROM setting WHERE name = :name", {"name": SCRUB_OWED})


def _scrub_owed(database) -> list[str]:
    """The migrations whose scrub is owed (SCRUB_OWED)."""
    owed = run_sql_on(database, "SELECT value FROM setting WHERE name = :name", {"name": SCRUB_OWED}).fetchone()
    return owed[0].split() if owed else []


def _check(current: SchemaStatus) -> SchemaStatus:
    if current.is_newer:
        raise SchemaTooNew(current.refusal())
    return current


def _apply(database) -> list[str]:
    """Inside the lock: another process may have migrated while this one waited for it. Migrations
    that remove secrets (SCRUB) owe a scrub, recorded in their transaction; a new database, made
    from schema.sql, had none to remove."""
    current = _check(status(database))
    if not current.pending:
        return []
    applied = _create(database) if current.empty else _run(database, current)
    add_cursor_key(database)
    return applied


def _run(database, current: SchemaStatus) -> list[str]:
    applied = runner(database).up()
    owing = [migration.name for migration in runner(database).migrations()
             if migration.name in applied and getattr(migration.load(), "SCRUB", False)]
    if owing:
        run_sql_on(database, "INSERT INTO setting (name, value) VALUES (:name, :value) "
                   "ON CONFLICT (name) DO UPDATE SET value = excluded.value",
                   {"name": SCRUB_OWED, "value": " ".join(current.scrub_owed + owing)})
    return applied


def _on_sqlite(database, apply) -> list[str]:
    """`apply` under SQLite's write lock (BEGIN IMMEDIATE waits for it), with foreign keys off:
    rebuilding a table drops it, and ON DELETE CASCADE would empty its children. The pragma is
    ignored inside a transaction, so it is set before BEGIN, and the keys are checked before COMMIT."""
    database.pragma("foreign_keys", 0)
    try:
        with database.atomic("IMMEDIATE"):
            applied = apply()
            broken = database.execute_sql("PRAGMA foreign_key_check").fetchall()
            if broken:
                raise RuntimeError(f"a migration broke {len(broken)} foreign keys, e.g. {broken[0]}")
        return applied
    finally:
        database.pragma("foreign_keys", 1)


def _on_postgresql(database, apply) -> list[str]:
    """`apply` in a transaction whose table locks give way (and retry) rather than deadlock with a
    running service."""
    for attempt in itertools.count(1):
        try:
            with database.atomic():
                database.execute_sql(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
                return apply()
        except OperationalError as error:
            if "lock timeout" not in str(error) or attempt == LOCK_RETRIES:
                raise
            time.sleep(min(0.02 * attempt, 0.5))


@contextmanager
def _migration_lock(database):
    """PostgreSQL: the advisory lock, held while this process migrates and scrubs. (On SQLite, the
    migrations' BEGIN IMMEDIATE holds the write lock.)"""
    if not isinstance(database, PostgresqlDatabase):
        yield
        return
    lock = {"lock_id": MIGRATION_LOCK_ID}
    run_sql_on(database, "SELECT pg_advisory_lock(:lock_id)", lock)
    try:
        yield
    finally:
        run_sql_on(database, "SELECT pg_advisory_unlock(:lock_id)", lock)


def _create(database) -> list[str]:
    """A new database: the current schema in one step, every migration recorded as applied."""
    for statement in schema_statements(SCHEMA_PATH.read_text()):
        database.execute_sql(statement)
    # The runner logs each as "up: … [FAKE]": say why first, so that no operator reads it as skipped.
    log.info("new database: made from schema.sql; its migrations are recorded as applied, not run")
    return runner(database).fake()


def schema_statements(sql: str) -> list[str]:
    """The statements of a DDL file, comments dropped."""
    lines = [line for line in sql.splitlines() if not line.lstrip().startswith("--")]
    return [s.strip() for s in "\n".join(lines).split(";") if s.strip()]
