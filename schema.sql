-- The current schema: a new database is made from this file in one step (partner/migrations), and
-- an existing one reaches the same shape by its numbered migrations (tests/test_migrations.py).
-- models.py mirrors it and tests/test_models.py proves the two agree. Portable SQL: runs on SQLite
-- and PostgreSQL.
-- Every *_at column holds Unix time in milliseconds (UTC).

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
    "active" BOOLEAN NOT NULL DEFAULT TRUE,
    "consecutive_failures" INTEGER NOT NULL DEFAULT 0,
    "auto_disabled_at" BIGINT,
    "created_at" BIGINT NOT NULL,
    -- The signing secret, sealed (partner/sealing.py): the id of the key that sealed it, and
    -- nonce + AES-GCM ciphertext. Never stored in plaintext.
    "secret_key_id" TEXT NOT NULL,
    "secret_sealed" BYTEA NOT NULL,
    "deleted_at" BIGINT,
    "concurrency_limit" INTEGER NOT NULL DEFAULT 1,
    "concurrency_ceiling" INTEGER,
    "concurrency_pin" INTEGER,
    "paused_until" BIGINT,
    "events" TEXT,
    FOREIGN KEY ("organization_id") REFERENCES "organization" ("id")
);
-- `deleted_at` is set when the partner deletes it: from then on it is hidden from every query and
-- never claimed, and retention.purge_deleted removes it and its history in short batches.
-- Attempts in flight to it at once (partner/concurrency.py): `concurrency_limit` adapts to what its
-- receiver shows, `concurrency_ceiling` is the limit at which the receiver last pushed back (null:
-- never), `concurrency_pin` the operator's fixed limit (null: adaptive), and `paused_until` the end
-- of a hold the receiver asked for with Retry-After.
-- `events` is the partner's filter (release 1.4): a JSON list of event types and `family.*` wildcards,
-- or null for every type (partner/event_types.py).
-- Keyset pagination of an organization's subscriptions, oldest first.
CREATE INDEX IF NOT EXISTS "subscription_organization_id_created_at_id"
    ON "subscription" ("organization_id", "created_at", "id");
-- When the next hold ends: the scanner wakes then (claims.next_due_at).
CREATE INDEX IF NOT EXISTS "subscription_paused_until" ON "subscription" ("paused_until");

-- One event, stored once however many subscriptions it goes to (release 1.4). `data` is its payload as
-- compact JSON bytes; each delivery's body is SPEC's envelope around those bytes with the delivery's
-- subscription_id, built the same way at every attempt (partner/envelopes.py), so every attempt of a
-- delivery sends the same bytes. `body` holds the whole envelope of an event queued before release 1.4,
-- sent as it was (null since). BYTEA is PostgreSQL's binary type; SQLite stores the bytes as a BLOB.
CREATE TABLE IF NOT EXISTS "event" (
    "id" TEXT NOT NULL PRIMARY KEY,
    "kind" TEXT NOT NULL,
    "body" BYTEA,
    "created_at" BIGINT NOT NULL,
    "occurred_at" BIGINT NOT NULL,
    "data" BYTEA NOT NULL
);
-- Retention walks finished events oldest first (retention.py).
CREATE INDEX IF NOT EXISTS "event_created_at" ON "event" ("created_at");

-- One event's delivery to one subscription: a delivery is (event_id, subscription_id), and what
-- happens to one never touches another's. `due_at` is when it is next claimable: the next attempt
-- time while pending, the lease expiry while in flight, null once delivered or dead.
-- `seq` is the enqueue order among the subscription's open deliveries (claims.py), and
-- `unrecorded` counts attempts claimed again after their lease expired without an outcome.
-- `ended` says, in words, why a dead letter ended, with the figures in force when it did (release 1.4).
CREATE TABLE IF NOT EXISTS "delivery" (
    "event_id" TEXT NOT NULL,
    "subscription_id" TEXT NOT NULL,
    "state" TEXT NOT NULL,
    "attempts" INTEGER NOT NULL DEFAULT 0,
    "due_at" BIGINT,
    "lease_token" TEXT,
    "seq" BIGINT NOT NULL DEFAULT 0,
    "unrecorded" INTEGER NOT NULL DEFAULT 0,
    "ended" TEXT,
    PRIMARY KEY ("event_id", "subscription_id"),
    FOREIGN KEY ("event_id") REFERENCES "event" ("id") ON DELETE CASCADE,
    FOREIGN KEY ("subscription_id") REFERENCES "subscription" ("id") ON DELETE CASCADE
);
-- Only open deliveries are indexed, so finding due work ignores any number of finished ones.
CREATE INDEX IF NOT EXISTS "delivery_due_at"
    ON "delivery" ("due_at") WHERE "state" IN ('pending', 'in_flight');
-- The few attempts in flight, by subscription: counted against each one's limit.
CREATE INDEX IF NOT EXISTS "delivery_in_flight"
    ON "delivery" ("subscription_id") WHERE "state" = 'in_flight';
-- Each subscription's open deliveries in claim order: its oldest due one, and which subscriptions
-- have any (claims.py walks them one subscription at a time).
CREATE INDEX IF NOT EXISTS "delivery_queue"
    ON "delivery" ("subscription_id", "due_at", "seq") WHERE "state" IN ('pending', 'in_flight');
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
    -- The cause in words, at most 200 characters (partner/outbound/causes.py); null for an
    -- http_status failure and for those recorded before release 1.3.
    "error_detail" TEXT,
    FOREIGN KEY ("subscription_id") REFERENCES "subscription" ("id") ON DELETE CASCADE,
    FOREIGN KEY ("event_id") REFERENCES "event" ("id") ON DELETE CASCADE
);
-- Keyset pagination of the failures audit, newest first.
CREATE INDEX IF NOT EXISTS "failure_subscription_id_attempted_at_id"
    ON "failure" ("subscription_id", "attempted_at", "id");
CREATE INDEX IF NOT EXISTS "failure_event_id" ON "failure" ("event_id", "subscription_id");

-- Service-wide values generated once, e.g. the key that signs pagination cursors.
CREATE TABLE IF NOT EXISTS "setting" (
    "name" TEXT NOT NULL PRIMARY KEY,
    "value" TEXT NOT NULL
);

-- Release 1.4: the platform's services that publish events (partner/publishers.py). The secret of
-- `vcp_<id>.<secret>` is stored only as its SHA-256, like an API key's.
CREATE TABLE IF NOT EXISTS "publisher" (
    "id" TEXT NOT NULL PRIMARY KEY,
    "name" TEXT NOT NULL,
    "secret_hash" TEXT NOT NULL,
    "created_at" BIGINT NOT NULL,
    "revoked_at" BIGINT
);
CREATE UNIQUE INDEX IF NOT EXISTS "publisher_name" ON "publisher" ("name");

-- The event types that may be published, registered by the operator; `schema` is a JSON Schema
-- (draft 2020-12) of `data`, as text, or null for any object.
CREATE TABLE IF NOT EXISTS "event_type" (
    "name" TEXT NOT NULL PRIMARY KEY,
    "description" TEXT,
    "schema" TEXT,
    "created_at" BIGINT NOT NULL,
    "updated_at" BIGINT NOT NULL,
    "retired_at" BIGINT
);

-- A publisher's Idempotency-Key, remembered 24 hours: the request's canonical hash and the answer
-- given (null while the first request with it is being answered).
CREATE TABLE IF NOT EXISTS "idempotency_key" (
    "publisher_id" TEXT NOT NULL,
    "key" TEXT NOT NULL,
    "request_hash" TEXT NOT NULL,
    "response" TEXT,
    "created_at" BIGINT NOT NULL,
    PRIMARY KEY ("publisher_id", "key")
);
CREATE INDEX IF NOT EXISTS "idempotency_key_created_at" ON "idempotency_key" ("created_at");
