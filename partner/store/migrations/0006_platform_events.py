"""Release 1.4: platform events. One event may go to many subscriptions, so a delivery becomes
(event_id, subscription_id): the event no longer names a subscription, and its payload is stored once
(`data`), each delivery's envelope built around it (partner/envelopes.py). An event queued before
keeps its whole envelope in `body`, sent as it was: its bytes never change across the upgrade.
Beside it, the partner's `events` filter on a subscription, why a dead letter ended (`delivery.ended`,
null for those dead-lettered before), and three new tables: publishers, event types and publishers'
idempotency keys.

SQLite cannot change a primary key or drop a column under a foreign key in place, so it rebuilds
`event` and `delivery` (foreign keys are off while migrations run: partner/store/migrations); PostgreSQL
alters them. `data` of an old event is read from its envelope, row by row."""

import json

from peewee import PostgresqlDatabase

from partner.store.sql import run_sql_on

SQLITE_REBUILD = (
    'CREATE TABLE "event_1_4" ("id" TEXT NOT NULL PRIMARY KEY, "kind" TEXT NOT NULL, "body" BYTEA, '
    '"created_at" BIGINT NOT NULL, "occurred_at" BIGINT NOT NULL, "data" BYTEA NOT NULL)',
    'INSERT INTO "event_1_4" ("id", "kind", "body", "created_at", "occurred_at", "data") '
    'SELECT "id", "kind", "body", "created_at", "created_at", X\'7B7D\' FROM "event"',
    'CREATE TABLE "delivery_1_4" ("event_id" TEXT NOT NULL, "subscription_id" TEXT NOT NULL, "state" TEXT NOT NULL, '
    '"attempts" INTEGER NOT NULL DEFAULT 0, "due_at" BIGINT, "lease_token" TEXT, "seq" BIGINT NOT NULL DEFAULT 0, '
    '"unrecorded" INTEGER NOT NULL DEFAULT 0, "ended" TEXT, PRIMARY KEY ("event_id", "subscription_id"), '
    'FOREIGN KEY ("event_id") REFERENCES "event" ("id") ON DELETE CASCADE, '
    'FOREIGN KEY ("subscription_id") REFERENCES "subscription" ("id") ON DELETE CASCADE)',
    'INSERT INTO "delivery_1_4" SELECT "event_id", "subscription_id", "state", "attempts", "due_at", "lease_token", '
    '"seq", "unrecorded", NULL FROM "delivery"',
    'DROP TABLE "delivery"',
    'DROP TABLE "event"',
    'ALTER TABLE "event_1_4" RENAME TO "event"',
    'ALTER TABLE "delivery_1_4" RENAME TO "delivery"',
    'CREATE INDEX "event_created_at" ON "event" ("created_at")',
)
POSTGRESQL_ALTER = (
    'ALTER TABLE "event" ADD COLUMN "occurred_at" BIGINT',
    'ALTER TABLE "event" ADD COLUMN "data" BYTEA',
    'UPDATE "event" SET "occurred_at" = "created_at", "data" = \'\\x7b7d\'::bytea',
    'ALTER TABLE "event" ALTER COLUMN "occurred_at" SET NOT NULL, ALTER COLUMN "data" SET NOT NULL, '
    'ALTER COLUMN "body" DROP NOT NULL, DROP COLUMN "subscription_id"',
    'ALTER TABLE "delivery" DROP CONSTRAINT "delivery_pkey", ADD PRIMARY KEY ("event_id", "subscription_id"), '
    'ADD COLUMN "ended" TEXT',
    'DROP INDEX IF EXISTS "delivery_due_at"',
    'DROP INDEX IF EXISTS "delivery_in_flight"',
    'DROP INDEX IF EXISTS "delivery_queue"',
    'DROP INDEX IF EXISTS "delivery_subscription_id_state"',
)
OPEN = "\"state\" IN ('pending', 'in_flight')"  # the partial indexes' own conditions (models)
IN_FLIGHT = "\"state\" = 'in_flight'"
BOTH = (
    f'CREATE INDEX "delivery_due_at" ON "delivery" ("due_at") WHERE {OPEN}',
    f'CREATE INDEX "delivery_in_flight" ON "delivery" ("subscription_id") WHERE {IN_FLIGHT}',
    f'CREATE INDEX "delivery_queue" ON "delivery" ("subscription_id", "due_at", "seq") WHERE {OPEN}',
    'CREATE INDEX "delivery_subscription_id_state" ON "delivery" ("subscription_id", "state")',
    'DROP INDEX "failure_event_id"',
    'CREATE INDEX "failure_event_id" ON "failure" ("event_id", "subscription_id")',
    'ALTER TABLE "subscription" ADD COLUMN "events" TEXT',
    'CREATE TABLE "publisher" ("id" TEXT NOT NULL PRIMARY KEY, "name" TEXT NOT NULL, "secret_hash" TEXT NOT NULL, '
    '"created_at" BIGINT NOT NULL, "revoked_at" BIGINT)',
    'CREATE UNIQUE INDEX "publisher_name" ON "publisher" ("name")',
    'CREATE TABLE "event_type" ("name" TEXT NOT NULL PRIMARY KEY, "description" TEXT, "schema" TEXT, '
    '"created_at" BIGINT NOT NULL, "updated_at" BIGINT NOT NULL, "retired_at" BIGINT)',
    'CREATE TABLE "idempotency_key" ("publisher_id" TEXT NOT NULL, "key" TEXT NOT NULL, "request_hash" TEXT NOT NULL, '
    '"response" TEXT, "created_at" BIGINT NOT NULL, PRIMARY KEY ("publisher_id", "key"))',
    'CREATE INDEX "idempotency_key_created_at" ON "idempotency_key" ("created_at")',
)
BATCH = 1000
_OLD_EVENTS = 'SELECT "id", "body" FROM "event" WHERE "id" > :after_id ORDER BY "id" LIMIT :limit'
# One statement a batch; both databases name a VALUES list's columns column1, column2.
_SET_DATA = ('UPDATE "event" SET "data" = envelope.column2 FROM (VALUES :rows) AS envelope '
             'WHERE "event"."id" = envelope.column1')


def up(migrator, db):
    statements = POSTGRESQL_ALTER if isinstance(db, PostgresqlDatabase) else SQLITE_REBUILD
    for statement in (*statements, *BOTH):
        db.execute_sql(statement)
    _read_data_from_envelopes(db)


def _read_data_from_envelopes(db) -> None:
    """Each old event's `data`, from its envelope (`{}` where the envelope has none to read)."""
    after = ""
    while rows := run_sql_on(db, _OLD_EVENTS, {"after_id": after, "limit": BATCH}).fetchall():
        updates = [(event_id, data) for event_id, body in rows if (data := _data_of(bytes(body))) != b"{}"]
        if updates:
            run_sql_on(db, _SET_DATA, {"rows": updates})
        after = rows[-1][0]


def _data_of(body: bytes) -> bytes:
    try:
        data = json.loads(body).get("data")
    except (ValueError, AttributeError):
        return b"{}"
    if not isinstance(data, dict):
        return b"{}"
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()
