"""The peewee models (mirrors of schema.sql) and the database lifecycle: open, bring the schema up to date."""

import logging
import os
import sqlite3

from peewee import (SQL, BigIntegerField, BlobField, BooleanField, DatabaseProxy, ForeignKeyField,
                    IntegerField, Model, ModelIndex, PostgresqlDatabase, TextField)
from playhouse.db_url import connect

from partner import migrations, sealing
from partner.operator.logs import QUERY_LOG_FILTER

# WAL lets readers run beside the one writer; the busy timeout makes writers queue, not fail.
# cache_size: 512 KiB of pages per connection instead of SQLite's 2 MiB. Every pooled connection
# keeps its own cache, and in WAL mode any commit empties the others' at their next read, so big
# caches held mostly stale pages: the worker's RSS grew by the connections' 2 MiB each for minutes
# (bench/soak.py). 512 KiB still holds what a claim touches in a million-row history (256 KiB made
# it 10 % slower: bench/state_scale.py); the operating system's page cache holds the rest.
# synchronous=NORMAL here, FULL for the commits acknowledged to someone (database.write_transaction):
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


def open_database(url: str, migrate: bool = True, sqlite_version: tuple[int, ...] = sqlite3.sqlite_version_info):
    """Bind `db` to the database at `url` (a playhouse.db_url URL) and, unless told not to, apply its
    pending migrations (raising migrations.SchemaTooNew for a database newer than the code). One
    database per process: a second call re-binds every model. `sqlite_version`: the library's."""
    scheme, rest = url.split("://", 1)
    if scheme.startswith("sqlite"):
        require_version("SQLite", sqlite_version, SQLITE_FLOOR)
    logging.getLogger("peewee").addFilter(QUERY_LOG_FILTER)  # idempotent: one filter instance
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
    if isinstance(database, PostgresqlDatabase):  # its version is known once connected
        with database.connection_context():
            version = postgresql_version(database.server_version)
        require_version("PostgreSQL", version, POSTGRESQL_FLOOR)
    db.initialize(database)
    if migrate:
        migrations.upgrade(database)
    return database


class DatabaseTooOld(RuntimeError):
    """A SQLite or PostgreSQL older than the code needs."""


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
    active = BooleanField(default=True, constraints=default("TRUE"))
    consecutive_failures = IntegerField(default=0, constraints=default("0"))
    auto_disabled_at = BigIntegerField(null=True)
    created_at = BigIntegerField()
    secret_key_id = TextField()
    secret_sealed = BytesField()
    deleted_at = BigIntegerField(null=True)

    class Meta:
        indexes = ((("organization", "created_at", "id"), False),)

    @property
    def secret(self) -> str:
        """The signing secret, opened: held in memory only, never stored in plaintext."""
        return sealing.open_secret(self.id, self.secret_key_id, self.secret_sealed)

    @secret.setter
    def secret(self, value: str) -> None:  # `Subscription(id=…, secret=…)`: the id first
        self.secret_key_id, self.secret_sealed = sealing.seal(self.id, value)


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
    seq = BigIntegerField(default=0, constraints=default("0"))
    unrecorded = IntegerField(default=0, constraints=default("0"))


# Literal, not bound parameters: SQLite uses a partial index only for a query that repeats its
# WHERE clause word for word, so the claim query and the index share this one fragment.
OPEN_CONDITION = "\"state\" IN ('pending', 'in_flight')"
IN_FLIGHT_CONDITION = "\"state\" = 'in_flight'"
IS_OPEN, IS_IN_FLIGHT = SQL(OPEN_CONDITION), SQL(IN_FLIGHT_CONDITION)
# A delivery whose subscription is not deleted (a deleted one's history waits for the purge).
LIVE_SUBSCRIPTION = ("SELECT 1 FROM subscription WHERE subscription.id = delivery.subscription_id "
                     "AND subscription.deleted_at IS NULL")
LIVE_CONDITION = f"EXISTS ({LIVE_SUBSCRIPTION})"
# The fragments above by the names the hand-written statements use: {open}, {in_flight}, {live}.
SQL_CONDITIONS = {"open": OPEN_CONDITION, "in_flight": IN_FLIGHT_CONDITION, "live": LIVE_CONDITION}
Delivery.add_index(ModelIndex(Delivery, (Delivery.due_at,), name="delivery_due_at").where(IS_OPEN))
Delivery.add_index(ModelIndex(Delivery, (Delivery.subscription,), name="delivery_in_flight")
                   .where(IS_IN_FLIGHT))
Delivery.add_index(ModelIndex(Delivery, (Delivery.subscription, Delivery.due_at, Delivery.seq),
                              name="delivery_queue").where(IS_OPEN))
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
    error_detail = TextField(null=True)

    class Meta:
        indexes = ((("subscription", "attempted_at", "id"), False),)


class Setting(BaseModel):
    name = TextField(primary_key=True)
    value = TextField()


MODELS = (Organization, ApiKey, Subscription, Event, Delivery, Failure, Setting)
