-- Release 1.1's schema.sql, frozen: the baseline every migration builds on. Never edit it.
-- A database made by release 1.0 or 1.1 (this DDL alone, or without its event_created_at index)
-- is brought to it by 0001_baseline; every statement is idempotent.

CREATE TABLE IF NOT EXISTS "organization" (
    "id" TEXT NOT NULL PRIMARY KEY,
    "slug" TEXT NOT NULL,
    "rate_limit_per_minute" INTEGER NOT NULL DEFAULT 600,
    "created_at" BIGINT NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS "organization_slug" ON "organization" ("slug");

CREATE TABLE IF NOT EXISTS "api_key" (
    "key_id" TEXT NOT NULL PRIMARY KEY,
    "organization_id" TEXT NOT NULL,
    "secret_hash" TEXT NOT NULL,
    "scopes" TEXT NOT NULL,
    "created_at" BIGINT NOT NULL,
    "revoked_at" BIGINT,
    FOREIGN KEY ("organization_id") REFERENCES "organization" ("id")
);
CREATE INDEX IF NOT EXISTS "api_key_organization_id" ON "api_key" ("organization_id");

CREATE TABLE IF NOT EXISTS "subscription" (
    "id" TEXT NOT NULL PRIMARY KEY,
    "organization_id" TEXT NOT NULL,
    "url" TEXT NOT NULL,
    "description" TEXT,
    "secret" TEXT NOT NULL,
    "active" BOOLEAN NOT NULL DEFAULT TRUE,
    "consecutive_failures" INTEGER NOT NULL DEFAULT 0,
    "auto_disabled_at" BIGINT,
    "created_at" BIGINT NOT NULL,
    FOREIGN KEY ("organization_id") REFERENCES "organization" ("id")
);
-- Keyset pagination of an organization's subscriptions, oldest first.
CREATE INDEX IF NOT EXISTS "subscription_organization_id_created_at_id"
    ON "subscription" ("organization_id", "created_at", "id");

-- One envelope for one subscription, serialized once: every attempt sends these bytes.
-- BYTEA is PostgreSQL's binary type; SQLite accepts the name and stores the bytes as a BLOB.
CREATE TABLE IF NOT EXISTS "event" (
    "id" TEXT NOT NULL PRIMARY KEY,
    "subscription_id" TEXT NOT NULL,
    "kind" TEXT NOT NULL,
    "body" BYTEA NOT NULL,
    "created_at" BIGINT NOT NULL,
    FOREIGN KEY ("subscription_id") REFERENCES "subscription" ("id") ON DELETE CASCADE
);
CREATE INDEX IF NOT EXISTS "event_subscription_id" ON "event" ("subscription_id");
-- Retention walks finished events oldest first (retention.py).
CREATE INDEX IF NOT EXISTS "event_created_at" ON "event" ("created_at");

-- The delivery state of one event. `due_at` is when it is next claimable: the next attempt
-- time while pending, the lease expiry while in flight, null once delivered or dead.
-- `subscription_id` repeats the event's, so that claims can skip busy subscriptions.
CREATE TABLE IF NOT EXISTS "delivery" (
    "event_id" TEXT NOT NULL PRIMARY KEY,
    "subscription_id" TEXT NOT NULL,
    "state" TEXT NOT NULL,
    "attempts" INTEGER NOT NULL DEFAULT 0,
    "due_at" BIGINT,
    "lease_token" TEXT,
    FOREIGN KEY ("event_id") REFERENCES "event" ("id") ON DELETE CASCADE,
    FOREIGN KEY ("subscription_id") REFERENCES "subscription" ("id") ON DELETE CASCADE
);
-- Only open deliveries are indexed, so finding due work ignores any number of finished ones.
CREATE INDEX IF NOT EXISTS "delivery_due_at"
    ON "delivery" ("due_at") WHERE "state" IN ('pending', 'in_flight');
-- The few attempts in flight, by subscription: a subscription has at most one at a time.
CREATE INDEX IF NOT EXISTS "delivery_in_flight"
    ON "delivery" ("subscription_id") WHERE "state" = 'in_flight';
-- Open deliveries of one subscription, dead-lettered together when it is auto-disabled.
CREATE INDEX IF NOT EXISTS "delivery_subscription_id_state" ON "delivery" ("subscription_id", "state");

CREATE TABLE IF NOT EXISTS "failure" (
    "id" TEXT NOT NULL PRIMARY KEY,
    "subscription_id" TEXT NOT NULL,
    "event_id" TEXT NOT NULL,
    "attempt" INTEGER NOT NULL,
    "http_status" INTEGER,
    "error" TEXT NOT NULL,
    "response_excerpt" TEXT NOT NULL,
    "duration_ms" INTEGER NOT NULL,
    "attempted_at" BIGINT NOT NULL,
    "next_attempt_at" BIGINT,
    FOREIGN KEY ("subscription_id") REFERENCES "subscription" ("id") ON DELETE CASCADE,
    FOREIGN KEY ("event_id") REFERENCES "event" ("id") ON DELETE CASCADE
);
-- Keyset pagination of the failures audit, newest first.
CREATE INDEX IF NOT EXISTS "failure_subscription_id_attempted_at_id"
    ON "failure" ("subscription_id", "attempted_at", "id");
CREATE INDEX IF NOT EXISTS "failure_event_id" ON "failure" ("event_id");

-- Service-wide values generated once, e.g. the key that signs pagination cursors.
CREATE TABLE IF NOT EXISTS "setting" (
    "name" TEXT NOT NULL PRIMARY KEY,
    "value" TEXT NOT NULL
);
