"""Release 1.3: attempts in flight per subscription, adapted to its receiver (partner/concurrency.py).

`subscription.concurrency_limit` starts at 1 for every subscription, as for a new one;
`concurrency_ceiling` (where the receiver last pushed back) and `concurrency_pin` (the operator's
fixed limit) start empty, and so does `paused_until` (a hold the receiver asked for with
Retry-After), whose index tells the scanner when the next hold ends.

Plain portable DDL, as 0003: both databases add a column with a constant default in place."""

STATEMENTS = (
    'ALTER TABLE "subscription" ADD COLUMN "concurrency_limit" INTEGER NOT NULL DEFAULT 1',
    'ALTER TABLE "subscription" ADD COLUMN "concurrency_ceiling" INTEGER',
    'ALTER TABLE "subscription" ADD COLUMN "concurrency_pin" INTEGER',
    'ALTER TABLE "subscription" ADD COLUMN "paused_until" BIGINT',
    'CREATE INDEX IF NOT EXISTS "subscription_paused_until" ON "subscription" ("paused_until")',
)


def up(migrator, db):
    for statement in STATEMENTS:
        db.execute_sql(statement)
