"""The peewee models (mirrors of schema.sql) and the database lifecycle."""

import logging
import os
import secrets
import string
import threading
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

from peewee import (SQL, BigIntegerField, BlobField, BooleanField, DatabaseProxy, ForeignKeyField,
                    IntegerField, InterfaceError, Model, ModelIndex, OperationalError, PostgresqlDatabase,
                    SqliteDatabase, TextField)
from playhouse.db_url import connect
from playhouse.pool import MaxConnectionsExceeded

from outages import Outage, describe
from read_cache import ReadCache

SCHEMA_PATH = Path(__file__).with_name("schema.sql")

# WAL lets readers run beside the one writer; the busy timeout makes writers queue, not fail.
# cache_size: 512 KiB of pages per connection instead of SQLite's 2 MiB. Every pooled connection
# keeps its own cache, and in WAL mode any commit empties the others' at their next read, so big
# caches held mostly stale pages: the worker's RSS grew by the connections' 2 MiB each for minutes
# (bench/soak.py). 512 KiB still holds what a claim touches in a million-row history (256 KiB made
# it 10 % slower: bench/state_scale.py); the operating system's page cache holds the rest.
SQLITE_PRAGMAS = {"journal_mode": "wal", "busy_timeout": 5000, "foreign_keys": 1,
                  "synchronous": "normal", "cache_size": -512}
# Connections are pooled: opening one (and, on SQLite, running the pragmas) per request or per
# delivery attempt costs more than the query. `timeout`: seconds to wait for a free connection.
POOLED_SCHEMES = {"sqlite", "postgres", "postgresql"}
POOL = {"max_connections": 64, "stale_timeout": 300, "timeout": 10}
# Any constant: the PostgreSQL advisory lock that serializes schema.sql between starting processes.
SCHEMA_LOCK_ID = 0x7061727472

db = DatabaseProxy()
# This process's view of the database's availability, shared by the request path and the scanner.
database_outage = Outage(logging.getLogger(__name__), "database",
                         "requests answer 503 and deliveries wait")

_ALPHANUMERIC = string.ascii_letters + string.digits


def random_token(length: int) -> str:
    return "".join(secrets.choice(_ALPHANUMERIC) for _ in range(length))


def new_id(prefix: str) -> str:
    """A random public identifier such as `wh_3kF9...` (119 bits of randomness)."""
    return f"{prefix}_{random_token(20)}"


class RedactQueryParameters(logging.Filter):
    """peewee logs each query with its parameters at DEBUG, and some parameters are secrets
    (a subscription's signing secret is stored as is: we need it to sign). Keep the SQL, drop the values."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, tuple) and len(record.msg) == 2:
            sql, params = record.msg
            record.msg, record.args = "%s -- %d parameter(s) redacted", (sql, len(params or ()))
        return True


_QUERY_LOG_FILTER = RedactQueryParameters()


def open_database(url: str):
    """Bind `db` to the database at `url` (a playhouse.db_url URL) and apply schema.sql."""
    logging.getLogger("peewee").addFilter(_QUERY_LOG_FILTER)  # idempotent: one filter instance
    scheme, rest = url.split("://", 1)
    params = dict(POOL)
    if scheme.startswith("sqlite"):
        # A pooled connection moves between threads, though only one uses it at a time.
        params.update(pragmas=SQLITE_PRAGMAS, check_same_thread=False)
        path = rest[1:].split("?", 1)[0]  # sqlite:///relative or sqlite:////absolute
        if path and path != ":memory:":
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    if scheme in POOLED_SCHEMES:
        url = f"{scheme}+pool://{rest}"
    database = connect(url, **params)
    db.initialize(database)
    apply_schema()
    database.read_cache = ReadCache(sqlite_file())
    return database


def sqlite_file() -> str | None:
    """The file of the SQLite database `db` is bound to, as SQLite itself opened it; None for
    PostgreSQL or an in-memory database."""
    if not is_sqlite():
        return None
    with db.connection_context():
        files = {row[1]: row[2] for row in db.execute_sql("PRAGMA database_list").fetchall()}
    return files.get("main") or None


def remembered(key, read, rows: int = 1):
    """read(), or what it returned since the last commit to the database (read_cache.py); `rows`:
    the size of its value. Inside a transaction it always reads: what a transaction sees may be
    older than the last commit, or not committed at all."""
    cache = getattr(db.obj, "read_cache", None)
    if cache is None or db.in_transaction():
        return read()
    return cache.get(key, read, rows)


def apply_schema() -> None:
    """Run every statement of schema.sql; each is idempotent (IF NOT EXISTS)."""
    with db.connection_context():
        with db.atomic():
            if isinstance(db.obj, PostgresqlDatabase):
                # IF NOT EXISTS is not atomic on PostgreSQL: workers starting together on a new
                # database would collide in the catalog. SQLite's write lock already serializes them.
                db.execute_sql("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK_ID,))
            for statement in schema_statements():
                db.execute_sql(statement)


def schema_statements() -> list[str]:
    lines = [line for line in SCHEMA_PATH.read_text().splitlines() if not line.startswith("--")]
    return [s.strip() for s in "\n".join(lines).split(";") if s.strip()]


def is_sqlite() -> bool:
    return isinstance(db.obj, SqliteDatabase)


def run_sql(template: str, params, ids: int = 0, **parts: str):
    """Execute a hand-written, portable statement of a hot path: {p} is the driver's placeholder,
    {ids} a list of `ids` of them, any other {name} a fixed SQL part from `parts`."""
    p = db.param
    return db.execute_sql(template.format(p=p, ids=", ".join([p] * ids), **parts), tuple(params))


def select_rows(template: str, params, ids: int = 0, **parts: str) -> list[dict]:
    """run_sql, with each row read by column name (`AS` names it): rows never read by position."""
    cursor = run_sql(template, params, ids, **parts)
    names = [column[0] for column in cursor.description]
    return [dict(zip(names, row)) for row in cursor.fetchall()]


# SQLite allows one writer. Writers of this process queue on this lock instead of in SQLite's busy
# handler, which sleeps in steps of 1 to 100 ms and starves a busy process; other processes still
# wait in the busy handler. Re-entrant, so write transactions nest.
_SQLITE_WRITER = threading.RLock()
# How long a writer waits for that lock before giving up (503). Unbounded, writers queued behind a
# database locked from outside held every request thread, and a GET waited ~15 s for a free thread
# though it needs no lock; in-process writes hold the lock for milliseconds, so this is only reached
# when the holder itself is stuck in the busy handler.
WRITER_WAIT_SECONDS = 1.0

# SQLite's messages for a database that cannot answer or write now (not for a bug in a statement).
_SQLITE_UNAVAILABLE = ("locked", "busy", "full", "disk i/o", "unable to open", "readonly")


class DatabaseBusy(OperationalError):
    """The in-process SQLite writer lock was not free within WRITER_WAIT_SECONDS."""


def is_unavailable(error: BaseException) -> bool:
    """Whether `error` means the database cannot answer or write right now (down, full, locked),
    so the operation may succeed later, as opposed to a bug."""
    if isinstance(error, (InterfaceError, MaxConnectionsExceeded)):
        return True
    if not isinstance(error, OperationalError):
        return False
    if isinstance(error, DatabaseBusy) or not is_sqlite():
        return True  # psycopg2's OperationalError is the connection's or the server's, never the SQL's
    return any(word in str(error).lower() for word in _SQLITE_UNAVAILABLE)


def discard_idle_connections() -> None:
    """Close the pool's idle connections: after an outage they point at a server that is gone."""
    close_idle = getattr(db.obj, "close_idle", None)
    if close_idle:
        close_idle()


@contextmanager
def write_transaction():
    """A transaction that writes. On SQLite it takes the write lock up front (BEGIN IMMEDIATE):
    a deferred transaction that reads and then writes fails instead of waiting when another
    writer got in between."""
    if not is_sqlite():
        with db.atomic():
            yield
            # Asked only during an outage: whether this transaction wrote (it has a transaction id).
            wrote = database_outage.active and db.execute_sql(
                "SELECT txid_current_if_assigned() IS NOT NULL").fetchone()[0]
        _end_outage_if(wrote)
        return
    # The connection first: waiting for a pooled one while holding the writer lock would hold up
    # every writer of the process, and those writers hold connections.
    db.connection()
    if not _SQLITE_WRITER.acquire(timeout=WRITER_WAIT_SECONDS):
        raise DatabaseBusy(f"another write held the database for over {WRITER_WAIT_SECONDS} s")
    try:
        changes = db.connection().total_changes
        with db.atomic("IMMEDIATE"):
            yield
        wrote = db.connection().total_changes > changes
    except OperationalError as error:
        raise _rolled_back_cause(error) from None
    finally:
        _SQLITE_WRITER.release()
    _end_outage_if(wrote)


def _end_outage_if(wrote: bool) -> None:
    """A committed write ends a database outage; an answered read or a transaction that changed
    nothing does not: reads go on through a full disk or a lock held from outside, and on SQLite a
    commit with nothing to write succeeds on a full disk."""
    if wrote and db.transaction_depth() == 0:
        database_outage.recovered()


def _rolled_back_cause(error: OperationalError) -> BaseException:
    """The error to report for a failed SQLite transaction. A commit that fails for want of space
    (or on I/O) is rolled back by SQLite itself; peewee's ROLLBACK after it then fails with "no
    transaction is active", which would hide the cause (and make a full disk look like a bug)."""
    cause = error
    while cause is not None and "no transaction is active" in str(cause):
        cause = cause.__context__
    return cause if isinstance(cause, OperationalError) else error


# A committed write that changes nothing a partner sees: the proof that the database takes writes.
# Beginning a transaction proves nothing: on a full disk SQLite begins one, and fails the commit.
# Its value must differ each time (probe_value): SQLite skips writing a row rewritten unchanged.
WRITE_PROBE = ("INSERT INTO setting (name, value) VALUES ('write_probe', {p}) "
               "ON CONFLICT (name) DO UPDATE SET value = excluded.value")


def probe_value() -> str:
    return random_token(16)


def write_refusal() -> str | None:
    """Why the database refuses a committed write now (a disk too full for SQLite's WAL or
    PostgreSQL's, a lock held past the bound, a server that is down), or None when it takes one."""
    try:
        with db.connection_context(), write_transaction():
            run_sql(WRITE_PROBE, (probe_value(),))
    except Exception as error:  # noqa: BLE001 - sorted by is_unavailable, the rest re-raised
        if not is_unavailable(error):
            raise
        return describe(error)
    return None


def database_name(url: str) -> str:
    """PARTNER_DATABASE_URL as a log line may show it: no password, and no query string (libpq
    takes `?password=` there too)."""
    shown = url.split("?", 1)[0].split("#", 1)[0]
    netloc = urlsplit(shown).netloc
    user_info, at, host = netloc.rpartition("@")
    if ":" in user_info:
        shown = shown.replace(netloc, f"{user_info.partition(':')[0]}{at}{host}", 1)
    return shown


class BytesField(BlobField):
    """Bytes in, bytes out on every database (psycopg2 reads BYTEA as a memoryview)."""

    def python_value(self, value):
        return None if value is None else bytes(value)


def default(sql: str) -> list:
    return [SQL(f"DEFAULT {sql}")]


class BaseModel(Model):
    class Meta:
        database = db
        legacy_table_names = False


class Organization(BaseModel):
    id = TextField(primary_key=True)
    slug = TextField(unique=True)
    rate_limit_per_minute = IntegerField(default=600, constraints=default("600"))
    created_at = BigIntegerField()


class ApiKey(BaseModel):
    key_id = TextField(primary_key=True)
    organization = ForeignKeyField(Organization, column_name="organization_id")
    secret_hash = TextField()
    scopes = TextField()  # space-separated, sorted
    created_at = BigIntegerField()
    revoked_at = BigIntegerField(null=True)

    @property
    def scope_set(self) -> set[str]:
        return set(self.scopes.split())


class Subscription(BaseModel):
    id = TextField(primary_key=True)
    organization = ForeignKeyField(Organization, column_name="organization_id", index=False)
    url = TextField()
    description = TextField(null=True)
    secret = TextField()
    active = BooleanField(default=True, constraints=default("TRUE"))
    consecutive_failures = IntegerField(default=0, constraints=default("0"))
    auto_disabled_at = BigIntegerField(null=True)
    created_at = BigIntegerField()

    class Meta:
        indexes = ((("organization", "created_at", "id"), False),)


class Event(BaseModel):
    id = TextField(primary_key=True)
    subscription = ForeignKeyField(Subscription, column_name="subscription_id", on_delete="CASCADE")
    kind = TextField()
    body = BytesField()
    created_at = BigIntegerField(index=True)


class Delivery(BaseModel):
    PENDING, IN_FLIGHT, DELIVERED, DEAD = "pending", "in_flight", "delivered", "dead"

    event = ForeignKeyField(Event, column_name="event_id", primary_key=True, on_delete="CASCADE")
    subscription = ForeignKeyField(Subscription, column_name="subscription_id", index=False,
                                   on_delete="CASCADE")
    state = TextField()
    attempts = IntegerField(default=0, constraints=default("0"))
    due_at = BigIntegerField(null=True)
    lease_token = TextField(null=True)


# Literal, not bound parameters: SQLite uses a partial index only for a query that repeats its
# WHERE clause word for word, so the claim query and the index share this one fragment.
OPEN_CONDITION = "\"state\" IN ('pending', 'in_flight')"
IN_FLIGHT_CONDITION = "\"state\" = 'in_flight'"
IS_OPEN, IS_IN_FLIGHT = SQL(OPEN_CONDITION), SQL(IN_FLIGHT_CONDITION)
Delivery.add_index(ModelIndex(Delivery, (Delivery.due_at,), name="delivery_due_at").where(IS_OPEN))
Delivery.add_index(ModelIndex(Delivery, (Delivery.subscription,), name="delivery_in_flight")
                   .where(IS_IN_FLIGHT))
Delivery.add_index(ModelIndex(Delivery, (Delivery.subscription, Delivery.state),
                              name="delivery_subscription_id_state"))


class Failure(BaseModel):
    id = TextField(primary_key=True)
    # Denormalized from the event so the audit's keyset index covers the query.
    subscription = ForeignKeyField(Subscription, column_name="subscription_id", index=False,
                                   on_delete="CASCADE")
    event = ForeignKeyField(Event, column_name="event_id", on_delete="CASCADE")
    attempt = IntegerField()
    http_status = IntegerField(null=True)
    error = TextField()
    response_excerpt = TextField()
    duration_ms = IntegerField()
    attempted_at = BigIntegerField()
    next_attempt_at = BigIntegerField(null=True)

    class Meta:
        indexes = ((("subscription", "attempted_at", "id"), False),)


class Setting(BaseModel):
    name = TextField(primary_key=True)
    value = TextField()


MODELS = (Organization, ApiKey, Subscription, Event, Delivery, Failure, Setting)
