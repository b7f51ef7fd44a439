"""Release 1.2: claims that go oldest first and share slots fairly (partner/claims.py), attempts
that are counted when their outcome was never written, and deletes that only mark a subscription.

`delivery.seq` is the enqueue order among deliveries due at the same time; an open backlog keeps
its order by taking its event's creation time. `delivery.unrecorded` counts attempts whose lease
expired unrecorded. `subscription.deleted_at` marks a deleted subscription until its history is
purged. The `delivery_queue` index walks each subscription's open deliveries in claim order.

Plain portable DDL: SQLite and PostgreSQL both add a column with a constant default in place,
without rebuilding the table (peewee's migrator would rebuild it on SQLite for the NOT NULL)."""

OPEN = "\"state\" IN ('pending', 'in_flight')"  # the partial indexes' own condition (partner/queue.py's OPEN)
STATEMENTS = (
    'ALTER TABLE "subscription" ADD COLUMN "deleted_at" BIGINT',
    'ALTER TABLE "delivery" ADD COLUMN "seq" BIGINT NOT NULL DEFAULT 0',
    'ALTER TABLE "delivery" ADD COLUMN "unrecorded" INTEGER NOT NULL DEFAULT 0',
    f'UPDATE "delivery" SET "seq" = (SELECT "created_at" FROM "event" WHERE "event"."id" = "delivery"."event_id") '
    f'WHERE {OPEN}',
    f'CREATE INDEX IF NOT EXISTS "delivery_queue" ON "delivery" ("subscription_id", "due_at", "seq") WHERE {OPEN}',
)


def up(migrator, db):
    for statement in STATEMENTS:
        db.execute_sql(statement)
