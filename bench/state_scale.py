"""state_scale: does the cost of finding due work and of reading the failures audit depend on how
much history the database holds?

Two databases are built from schema.sql with sqlite3 directly (fast, no service): the same 100
subscriptions and the same 100 due deliveries, plus SMALL or LARGE historical events, each with a
finished delivery (delivered or dead) and a failure record; 90 % of the failures belong to one
"hot" subscription, whose audit is paged. The service's own functions are then timed on each,
alternating between the two in rounds: `outbox.claim_due` (in a transaction rolled back each
time, so every call sees the same due work) and `events.failures_page`, first page and a page
from a cursor in the middle of the hot subscription's history. The SQL they send is captured and
shown with EXPLAIN QUERY PLAN.
"""

import json
import os
import random
import sqlite3
import statistics
import sys
import time
import uuid

from harness import SERVICE_ROOT, at_most, info, measured_revision, pick, report, workdir

SMALL = 1_000
LARGE = pick(1_000_000, 100_000)
SUBSCRIPTIONS = 100
DUE = 100  # pending deliveries due now, the same in both databases
ROUNDS = pick(7, 3)
SCRAPES = pick(200, 30)
PRUNE_BATCHES = pick(40, 10)
RETENTION_DAYS = 30
CALLS_PER_ROUND = pick(100, 30)
PAGE = 20
NOW_MS = 1_790_000_000_000
DAY_MS = 86_400_000

sys.path.insert(0, str(SERVICE_ROOT))
from partner import queue  # noqa: E402  (the service's modules, from SERVICE_ROOT)
from partner.store.sql import bind  # noqa: E402
from partner import outbox  # noqa: E402
from partner import retention  # noqa: E402
from app import create_app  # noqa: E402
from models import Failure, Subscription, db  # noqa: E402
from tests.support import open_database  # noqa: E402
from peewee import SqliteDatabase  # noqa: E402

try:  # events.py was split out of the outbox on 2026-11-26
    from partner import events  # noqa: E402
except ImportError:
    events = outbox
try:  # release 1.2: schema versions, sealed secrets
    from partner import sealing  # noqa: E402
    from partner.store import migrations  # noqa: E402
    os.environ.setdefault("PARTNER_ENCRYPTION_KEYS", json.dumps([sealing.new_key()]))
    sealing.use(sealing.keyring_of(os.environ["PARTNER_ENCRYPTION_KEYS"]))
except ImportError:
    migrations = sealing = None


# A ping's payload (release 1.4 stores it once per event; `body` is then the envelope of an event
# queued before it, which these rows also are).
DATA = (b'{"message":"This is a test ping from the Partner Integration Service.",'
        b'"triggered_by_key_id":"Q3k9benchbenchbench0"}')


def body(event_id: str, subscription_id: str, occurred_ms: int) -> bytes:
    return (f'{{"event":"vc.test.ping","id":"{event_id}","subscription_id":"{subscription_id}",'
            f'"occurred_at":"{occurred_ms}","data":{{"message":"This is a test ping from the Partner '
            f'Integration Service.","triggered_by_key_id":"Q3k9benchbenchbench0"}}}}').encode()


# The columns this bench fills, per table. schema.sql may have fewer (a column that left) or more
# (it must then have a default, or insert() says which one this bench has to learn about).
COLUMNS = {
    "organization": ("id", "slug", "rate_limit_per_minute", "created_at"),
    "subscription": ("id", "organization_id", "url", "description", "secret", "active",
                     "consecutive_failures", "auto_disabled_at", "created_at", "secret_key_id", "secret_sealed"),
    "event": ("id", "subscription_id", "kind", "body", "created_at", "occurred_at", "data"),
    "delivery": ("event_id", "subscription_id", "state", "attempts", "due_at", "lease_token"),
    "failure": ("id", "subscription_id", "event_id", "attempt", "http_status", "error",
                "response_excerpt", "duration_ms", "attempted_at", "next_attempt_at"),
}


def insert(connection: sqlite3.Connection, table: str, rows) -> None:
    """executemany over rows shaped like COLUMNS[table], sending only the columns the table has."""
    info = connection.execute(f'PRAGMA table_info("{table}")').fetchall()
    existing = {row[1] for row in info}
    unknown = [row[1] for row in info  # NOT NULL, no default, not filled here
               if row[3] and row[4] is None and row[1] not in COLUMNS[table]]
    if unknown:
        raise RuntimeError(f"state_scale does not fill {table}.{', '.join(unknown)}: teach build()")
    keep = [name for name in COLUMNS[table] if name in existing]
    names = ", ".join(f'"{name}"' for name in keep)
    values = ", ".join(f":{name}" for name in keep)
    connection.executemany(f'INSERT INTO "{table}" ({names}) VALUES ({values})',
                           (dict(zip(COLUMNS[table], row)) for row in rows))


def build(path, history: int) -> None:
    """A database with `history` finished events (each with one failure record) and DUE due ones."""
    rng = random.Random(history)
    connection = sqlite3.connect(path)
    connection.executescript(schema_sql())
    connection.execute("PRAGMA journal_mode=OFF")
    connection.execute("PRAGMA synchronous=OFF")
    subscriptions = [f"wh_{n:020d}" for n in range(SUBSCRIPTIONS)]
    hot = subscriptions[0]
    with connection:
        insert(connection, "organization", [("org_bench", "bench", 600, NOW_MS)])
        insert(connection, "subscription",
               [(s, "org_bench", f"http://127.0.0.1:9999/ok/{n}", None, "whsec_" + "x" * 43, 1, 0,
                 None, NOW_MS - 400 * DAY_MS, *sealed(s, "whsec_" + "x" * 43)) for n, s in enumerate(subscriptions)])
        events, deliveries, failures = [], [], []
        for n in range(history):
            event_id = f"evt_{uuid.UUID(int=rng.getrandbits(128), version=4)}"
            subscription = hot if rng.random() < 0.9 else rng.choice(subscriptions)
            at = NOW_MS - 365 * DAY_MS + n * (365 * DAY_MS // history)
            events.append((event_id, subscription, "vc.test.ping", body(event_id, subscription, at), at, at, DATA))
            delivered = rng.random() < 0.5
            deliveries.append((event_id, subscription, "delivered" if delivered else "dead",
                               1 if delivered else 7, None, None))
            failures.append((f"fail_{rng.getrandbits(119):030x}", subscription, event_id, 1, 500,
                             "http_status", "Internal Server Error", 41, at + 1000, at + 61_000))
        for n in range(DUE):
            event_id = f"evt_{uuid.UUID(int=rng.getrandbits(128), version=4)}"
            subscription = subscriptions[n % SUBSCRIPTIONS]
            events.append((event_id, subscription, "vc.test.ping", body(event_id, subscription, NOW_MS),
                           NOW_MS - 1000, NOW_MS - 1000, DATA))
            deliveries.append((event_id, subscription, "pending", 0, NOW_MS - 1000, None))
        insert(connection, "event", events)
        insert(connection, "delivery", deliveries)
        insert(connection, "failure", failures)
    # No ANALYZE: the service never runs it, so its planner works without statistics too.
    connection.close()
    if migrations is not None:  # the database is schema.sql's, as the service makes a new one
        migrations.runner(SqliteDatabase(path)).fake()


def sealed(subscription_id: str, secret: str) -> tuple:
    """A subscription's stored secret columns (release 1.2), under the bench's key."""
    return sealing.seal(subscription_id, secret) if sealing is not None else (None, None)


def schema_sql() -> str:
    return (SERVICE_ROOT / "schema.sql").read_text()


class Database:
    """One of the two databases, bound to the service's `db` proxy while it is measured."""

    def __init__(self, path):
        self.database = open_database(f"sqlite:///{path}")
        with db.connection_context():
            self.hot = Subscription.get_by_id("wh_00000000000000000000")
            count = Failure.select().where(Failure.subscription == self.hot).count()
            middle = (Failure.select(Failure.attempted_at, Failure.id)
                      .where(Failure.subscription == self.hot)
                      .order_by(Failure.attempted_at.desc(), Failure.id.desc())
                      .offset(count // 2).limit(1).tuples().first())
        self.hot_failures = count
        self.middle = list(middle)

    def bind(self) -> None:
        db.initialize(self.database)

    def claim(self) -> None:
        with db.atomic() as transaction:
            claims = outbox.claim_due(NOW_MS, 8, 40_000)
            transaction.rollback()
        assert len(claims) == 8, claims

    def first_page(self) -> None:
        rows, position = events.failures_page(self.hot, None, PAGE)
        assert len(rows) == PAGE and position

    def deep_page(self) -> None:
        rows, position = events.failures_page(self.hot, self.middle, PAGE)
        assert len(rows) == PAGE and position


QUERIES = {"claim_due (8 of 100 due)": Database.claim,
           "failures page, first": Database.first_page,
           "failures page, mid-history cursor": Database.deep_page}


def capture_sql(database: Database, operation) -> list[tuple[str, tuple]]:
    """The statements (with their parameters) the operation sends to SQLite."""
    sent, real = [], database.database.execute_sql

    def recording(sql, params=None, *args, **kwargs):
        sent.append((sql, tuple(params or ())))
        return real(sql, params, *args, **kwargs)

    database.database.execute_sql = recording
    try:
        operation(database)
    finally:
        del database.database.execute_sql
    transaction = ("BEGIN", "SAVEPOINT", "ROLLBACK", "RELEASE")
    return [(sql, params) for sql, params in sent if not sql.startswith(transaction)]


def query_plans(path, statements) -> list[dict]:
    connection = sqlite3.connect(path)
    plans = []
    for sql, params in statements:
        rows = connection.execute(f"EXPLAIN QUERY PLAN {sql}", params).fetchall()
        plans.append({"sql": sql, "plan": [row[-1] for row in rows]})
    connection.close()
    return plans


def time_scrapes(path) -> list[float]:
    """Milliseconds per GET /metrics through the real app (test client) on the database at `path`."""
    app = create_app({"DATABASE_URL": f"sqlite:///{path}", "SCHEDULER_ENABLED": False,
                      "CLOCK": lambda: NOW_MS / 1000})
    client = app.test_client()
    assert b"partner_deliveries_due 100.0" in client.get("/metrics").data
    timings = []
    for _ in range(SCRAPES):
        begun = time.perf_counter()
        response = client.get("/metrics")
        timings.append((time.perf_counter() - begun) * 1000)
        assert response.status_code == 200
    return timings


def time_prune_batches(database: Database) -> tuple[list[float], int]:
    """Milliseconds per retention batch (one write transaction each) and the rows each removed."""
    database.bind()
    before = retention.cutoff(NOW_MS, RETENTION_DAYS)
    timings = []
    with db.connection_context():
        for _ in range(PRUNE_BATCHES):
            begun = time.perf_counter()
            pruned = retention.prune_batch(before, retention.BATCH)
            timings.append((time.perf_counter() - begun) * 1000)
            assert pruned.events == retention.BATCH, pruned
    return timings, retention.BATCH


def operator_plans(database: Database, path) -> dict:
    """The plans of the scrape's backlog count and of one retention batch's selection."""
    database.bind()
    statements = [bind(queue.DUE, {"now_ms": NOW_MS}, "?")]
    with db.connection_context():
        with db.atomic() as transaction:
            sent = capture_sql(database, lambda _: retention.prune_batch(
                retention.cutoff(NOW_MS, RETENTION_DAYS), retention.BATCH))
            transaction.rollback()
    statements += [(sql, params) for sql, params in sent if sql.startswith("SELECT")]
    return {"operator: backlog count, retention batch": query_plans(path, statements)}


def main() -> dict:
    measured_revision()
    with workdir("scale") as tmp:
        paths = {"small": tmp / "small.sqlite3", "large": tmp / "large.sqlite3"}
        started = time.monotonic()
        build(paths["small"], SMALL)
        build(paths["large"], LARGE)
        build_seconds = time.monotonic() - started
        databases = {name: Database(path) for name, path in paths.items()}
        timings = {(name, query): [] for name in databases for query in QUERIES}
        for _ in range(ROUNDS):
            for name, database in databases.items():
                database.bind()
                with db.connection_context():
                    for query, operation in QUERIES.items():
                        operation(database)  # warm
                        for _ in range(CALLS_PER_ROUND):
                            begun = time.perf_counter()
                            operation(database)
                            timings[(name, query)].append((time.perf_counter() - begun) * 1000)
        plans = {}
        databases["large"].bind()
        with db.connection_context():
            for query, operation in QUERIES.items():
                plans[query] = query_plans(paths["large"], capture_sql(databases["large"], operation))
        plans.update(operator_plans(databases["large"], paths["large"]))
        hot_failures = databases["large"].hot_failures
        scrapes = time_scrapes(paths["large"])
        batches, batch_rows = time_prune_batches(databases["large"])
        for database in databases.values():
            database.database.close()
    medians = {key: statistics.median(values) for key, values in timings.items()}
    figures = []
    for query in QUERIES:
        figures.append(info(f"{query}, {SMALL:,} rows", medians[("small", query)], "ms"))
        figures.append(info(f"{query}, {LARGE:,} rows", medians[("large", query)], "ms"))
        figures.append(at_most(f"{query}: ratio large / small",
                               medians[("large", query)] / medians[("small", query)], "", 1.5))
    figures.append(at_most(f"/metrics scrape (median), {LARGE:,} rows", statistics.median(scrapes),
                           "ms", 50))
    figures.append(info(f"/metrics scrape (slowest of {SCRAPES})", max(scrapes), "ms"))
    figures.append(at_most(f"retention batch of {batch_rows} events: write lock (median), {LARGE:,} rows",
                           statistics.median(batches), "ms", 50))
    figures.append(info(f"retention batch: write lock (slowest of {PRUNE_BATCHES})", max(batches), "ms"))
    print_plans(plans)
    return report("state_scale", figures,
                  {"small_rows": SMALL, "large_rows": LARGE, "hot_subscription_failures": hot_failures,
                   "calls": ROUNDS * CALLS_PER_ROUND, "build_s": round(build_seconds, 1),
                   "scrapes": SCRAPES, "retention_batches": PRUNE_BATCHES},
                  {"query_plans": plans})


def print_plans(plans: dict) -> None:
    for query, statements in plans.items():
        print(f"\n-- EXPLAIN QUERY PLAN: {query}")
        for statement in statements:
            print(f"   {statement['sql']}")
            for line in statement["plan"]:
                print(f"      {line}")


if __name__ == "__main__":
    main()
