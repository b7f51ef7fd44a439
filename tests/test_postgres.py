"""The same code on a real PostgreSQL server: schema.sql, the models, and the API's main flows over HTTP.

Every test gets a database of its own (`postgres_url`: an empty schema). The HTTP flows of
test_webhooks.py and test_delivery.py run here too: they are marked `both_databases`.
"""

import psycopg2
import pytest
from peewee import PostgresqlDatabase

import models
from partner import resealing, sealing
from partner.store import migrations
from tests import support
from partner.errors import ValidationError
from partner.keys import create_key, revoke_key, rotate_key
from models import (ApiKey, Delivery, Event, EventType, Failure, IdempotencyKey, Organization, Publisher, Setting,
                    Subscription, db)
from tests.support import delivery_of, open_database
from partner.store.sql import is_sqlite
from partner.store.sql import write_transaction
from partner.outbound.transport import AttemptResult
from partner.events import enqueue_test_ping
from partner.outbox import claim_due
from partner.outcomes import Outcome, _held, write_outcomes
from partner.retry import RetryPolicy
from partner.subscriptions import MAX_SUBSCRIPTIONS, create_subscription, delete_subscription, secret_of


@pytest.fixture
def backend():
    """Every test of this module is about PostgreSQL."""
    return "postgresql"


@pytest.fixture
def database(database_url):
    """`db` bound to this test's PostgreSQL database, schema applied, connected."""
    database = open_database(database_url)
    with db.connection_context():
        yield database


def table_names() -> list[str]:
    return sorted(model._meta.table_name for model in models.MODELS)


def connected(work):
    """`work`, run on a connection of its own (peewee's are per thread)."""
    def run():
        with db.connection_context():
            work()
    return run


def run_together(count: int, work) -> list[Exception]:
    """Run `work` on `count` threads released at the same moment, each on a connection of its own.
    Returns what they raised."""
    return support.run_together(*[connected(work)] * count)


# --- schema.sql -----------------------------------------------------------------------------------

def test_open_database_gives_a_postgresql_database(database):
    assert isinstance(database, PostgresqlDatabase)
    assert not is_sqlite()


def test_every_connection_of_the_service_is_bounded(database):
    """The server's bounds in every session, the kernel's on every socket (docs/operations.md)."""
    assert [db.execute_sql(f"SHOW {name}").fetchone()[0] for name in
            ("statement_timeout", "lock_timeout", "idle_in_transaction_session_timeout")] == ["5s", "2s", "30s"]
    libpq = db.connection().get_dsn_parameters()
    assert {name: libpq[name] for name in ("connect_timeout", "keepalives", "keepalives_idle", "tcp_user_timeout")} \
        == {"connect_timeout": "3", "keepalives": "1", "keepalives_idle": "30", "tcp_user_timeout": "10000"}


def test_a_libpq_setting_in_the_url_replaces_the_services_own(database_url):
    open_database(f"{database_url}&connect_timeout=10&keepalives_idle=60")
    with db.connection_context():
        libpq = db.connection().get_dsn_parameters()
    assert (libpq["connect_timeout"], libpq["keepalives_idle"]) == ("10", "60")


def test_schema_applies_twice(database_url):
    open_database(database_url)
    database = open_database(database_url)
    assert sorted(database.get_tables()) == sorted([*table_names(), migrations.HISTORY_TABLE])


def describe(database) -> dict:
    """Columns, indexes and constraints of the database's current schema, as comparable data."""
    queries = {
        "columns": """SELECT table_name, ordinal_position, column_name, data_type, is_nullable, column_default
                      FROM information_schema.columns WHERE table_schema = current_schema()""",
        "indexes": """SELECT tablename, indexname, replace(indexdef, current_schema() || '.', '')
                      FROM pg_indexes WHERE schemaname = current_schema()""",
        "constraints": """SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid)
                          FROM pg_constraint WHERE connamespace = current_schema()::regnamespace""",
    }
    with database.connection_context():
        return {part: sorted(database.execute_sql(sql).fetchall()) for part, sql in queries.items()}


@pytest.fixture
def scratch_database(postgres_server):
    """A second, empty schema on the same server."""
    database = postgres_server.connect(postgres_server.create_schema())
    yield database
    database.close()


@pytest.mark.parametrize("part", ["columns", "indexes", "constraints"])
def test_models_and_schema_describe_the_same_database(database, scratch_database, part):
    with scratch_database.bind_ctx(models.MODELS):
        scratch_database.create_tables(models.MODELS)
    # The migration history is the runner's table, not the service's: no model describes it.
    described = [row for row in describe(database)[part] if migrations.HISTORY_TABLE not in row[0]]
    assert describe(scratch_database)[part] == described


# --- the models -----------------------------------------------------------------------------------

BIG_MS = 4_102_444_800_000  # 2100-01-01: past 32 bits
BODY = b'{"event":"vc.test.ping","note":"\xc3\xa9"}\x00\xff raw bytes'


def test_every_table_round_trips(database):
    org = Organization.create(id="org_1", slug="acme", rate_limit_per_minute=7, created_at=BIG_MS)
    ApiKey.create(key_id="K" * 20, organization=org, secret_hash="h" * 64, scopes="identity:read",
                  created_at=BIG_MS, revoked_at=BIG_MS + 1)
    subscription = Subscription.create(id="wh_1", organization=org, url="https://partner.example/é",
                                       description=None, **support.sealed("wh_1", "whsec_x"), active=False,
                                       consecutive_failures=3, auto_disabled_at=BIG_MS, created_at=BIG_MS,
                                       deleted_at=BIG_MS + 2, concurrency_limit=16, concurrency_ceiling=5,
                                       concurrency_pin=2, paused_until=BIG_MS + 3, events='["lead.*"]')
    event = Event.create(id="evt_1", kind="vc.test.ping", body=BODY, created_at=BIG_MS, occurred_at=BIG_MS + 4,
                         data=BODY)
    Delivery.create(event=event, subscription=subscription, state=Delivery.PENDING, attempts=2,
                    due_at=BIG_MS, lease_token=None, seq=BIG_MS, unrecorded=1, ended="why — é")
    Failure.create(id="fail_1", subscription=subscription, event=event, attempt=2, http_status=None,
                   error="timeout", response_excerpt="", duration_ms=10_000, attempted_at=BIG_MS,
                   next_attempt_at=None, error_detail="deadline of 10 s reached while connecting — é")
    Setting.delete().execute()  # the cursor key the schema came with
    Setting.create(name="a_setting", value="ab" * 32)
    assert secret_of(Subscription.get()) == "whsec_x"  # stored sealed, opened again
    sealed = ("secret_key_id", "secret_sealed")
    assert {model: [{k: v for k, v in row.__data__.items() if k not in sealed} for row in model.select()]
            for model in models.MODELS} == {
        Organization: [{"id": "org_1", "slug": "acme", "rate_limit_per_minute": 7, "created_at": BIG_MS}],
        ApiKey: [{"key_id": "K" * 20, "organization": "org_1", "secret_hash": "h" * 64,
                  "scopes": "identity:read", "created_at": BIG_MS, "revoked_at": BIG_MS + 1}],
        Subscription: [{"id": "wh_1", "organization": "org_1", "url": "https://partner.example/é",
                        "description": None, "active": False,
                        "consecutive_failures": 3, "auto_disabled_at": BIG_MS, "created_at": BIG_MS,
                        "deleted_at": BIG_MS + 2, "concurrency_limit": 16, "concurrency_ceiling": 5,
                        "concurrency_pin": 2, "paused_until": BIG_MS + 3, "events": '["lead.*"]'}],
        Event: [{"id": "evt_1", "kind": "vc.test.ping", "body": BODY, "created_at": BIG_MS,
                 "occurred_at": BIG_MS + 4, "data": BODY}],
        Delivery: [{"event": "evt_1", "subscription": "wh_1", "state": "pending", "attempts": 2,
                    "due_at": BIG_MS, "lease_token": None, "seq": BIG_MS, "unrecorded": 1, "ended": "why — é"}],
        Failure: [{"id": "fail_1", "subscription": "wh_1", "event": "evt_1", "attempt": 2,
                   "http_status": None, "error": "timeout", "response_excerpt": "", "duration_ms": 10_000,
                   "attempted_at": BIG_MS, "next_attempt_at": None,
                   "error_detail": "deadline of 10 s reached while connecting — é"}],
        Setting: [{"name": "a_setting", "value": "ab" * 32}],
        Publisher: [], EventType: [], IdempotencyKey: [],
    }
    stored = Event.get_by_id("evt_1")
    assert stored.body == BODY and type(stored.body) is bytes
    assert Subscription.get_by_id("wh_1").active is False
    assert Subscription.select().where(Subscription.active == False).count() == 1  # noqa: E712


def test_defaults_come_from_the_schema(database):
    db.execute_sql("""INSERT INTO "organization" ("id", "slug", "created_at") VALUES ('org_1', 'acme', 1)""")
    db.execute_sql("""INSERT INTO "subscription" ("id", "organization_id", "url", "created_at", "secret_key_id",
                      "secret_sealed") VALUES ('wh_1', 'org_1', 'https://x.example/', 1, 'k', '\\x00')""")
    subscription = Subscription.select(Subscription, Organization).join(Organization).get()
    assert (subscription.organization.rate_limit_per_minute, subscription.active,
            subscription.consecutive_failures) == (600, True, 0)


def test_deleting_a_subscription_cascades(database):
    org = Organization.create(id="org_1", slug="acme", created_at=1)
    subscription = Subscription.create(id="wh_1", organization=org, url="https://x.example/",
                                       **support.sealed("wh_1", "s"), created_at=1)
    event = Event.create(id="evt_1", kind="k", data=b"{}", occurred_at=1, created_at=1)
    Delivery.create(event=event, subscription=subscription, state=Delivery.PENDING, due_at=1)
    Failure.create(id="fail_1", subscription=subscription, event=event, attempt=1, error="timeout",
                   response_excerpt="", duration_ms=1, attempted_at=1)
    subscription.delete_instance()
    # Since release 1.4 an event belongs to no subscription: only the delivery and its failures go.
    assert [model.select().count() for model in (Event, Delivery, Failure)] == [1, 0, 0]


def test_the_subscription_cap_holds_when_creates_race(database):
    org = Organization.create(id="org_1", slug="acme", created_at=1)
    for _ in range(MAX_SUBSCRIPTIONS - 2):
        create_subscription(org.id, "https://x.example/", None, 1)
    errors = run_together(6, lambda: create_subscription(org.id, "https://x.example/", None, 1))
    assert [type(error) for error in errors] == [ValidationError] * 4
    assert Subscription.select().count() == MAX_SUBSCRIPTIONS


def test_a_lease_being_recorded_is_not_taken_over_meanwhile(database):
    """Between checking its lease and finishing, a late attempt keeps the row: a scanner that finds
    the lease expired in that moment skips it rather than making the attempt a second time."""
    org = Organization.create(id="org_1", slug="acme", created_at=1)
    enqueue_test_ping(create_subscription(org.id, "https://x.example/", None, 1), "KEYID", 1)
    [claim] = claim_due(1, 10, 1000)
    with write_transaction():
        assert _held([Outcome(claim, FAILED, 1, 1)]) == {claim.delivery}
        taken = []
        assert run_together(1, lambda: taken.extend(claim_due(1 + 1000, 10, 1000))) == []
        assert taken == []


def sessions_waiting(count: int):
    """A condition on the server: at least `count` sessions wait for a lock another holds."""
    def waiting(watcher) -> bool:
        with watcher.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                           "AND datname = current_database()")
            return cursor.fetchone()[0] >= count
    return waiting


def race_behind(postgres_url: str, hold: list[tuple[str, tuple]], *steps) -> list[Exception]:
    """Run the `hold` statements in a session of its own, uncommitted, and start each
    `(work, under_way)` in turn, each on a thread of its own: the next once `under_way(watcher)`,
    asked in another session, is true. Then commit the held session and wait for the works (each
    must end); returns what they raised."""
    holder, watcher = psycopg2.connect(postgres_url), psycopg2.connect(postgres_url)
    watcher.autocommit = True
    errors, threads = [], []
    try:
        for statement, params in hold:
            holder.cursor().execute(statement, params)
        for work, under_way in steps:
            threads.append(support.in_thread(work, errors))
            assert support.eventually(lambda: under_way(watcher))
        holder.commit()
        for thread in threads:
            thread.join(10)
            assert not thread.is_alive()
    finally:
        holder.close()
        watcher.close()
    return errors


def held_delivery(event_id: str) -> list[tuple[str, tuple]]:
    return [("SELECT 1 FROM delivery WHERE event_id = %s FOR UPDATE", (event_id,))]


FAILED = AttemptResult(False, 500, "http_status", "", 5)


def test_a_delete_and_the_outcome_it_races_wait_in_line_not_in_a_cycle(database, postgres_url):
    """A partner deletes a subscription while its attempt's outcome is written: both lock the
    delivery before the subscription. In the other order each would hold what the other waits for,
    and PostgreSQL would roll one back as a deadlock (a 503 to the partner, or an outage logged).

    The outcome queues for the held delivery first, then the delete."""
    org = Organization.create(id="org_1", slug="acme", created_at=1)
    subscription = create_subscription(org.id, "https://x.example/", None, 1)
    enqueue_test_ping(subscription, "KEYID", 1)
    [claim] = claim_due(1, 10, 1000)
    recorded = []
    errors = race_behind(
        postgres_url, held_delivery(claim.event_id),
        (connected(lambda: recorded.append(support.record_attempt(claim, FAILED, 2, 7, RetryPolicy([60], 20), 0))),
         sessions_waiting(1)),
        (connected(lambda: delete_subscription(subscription, 3)), sessions_waiting(2)))
    assert errors == []
    assert recorded[0].recorded and Failure.select().count() == 1
    assert Subscription.get_by_id(subscription.id).deleted_at == 3


@pytest.mark.parametrize("result", [FAILED, AttemptResult(True, 200, None, "", 5)], ids=["failed", "delivered"])
def test_a_delete_committing_while_a_claim_is_under_way_waits_for_it_and_records_nothing(database, postgres_url,
                                                                                         result):
    """A partner deletes a subscription while a claim that has taken its delivery is still uncommitted
    (here it waits for the event table after its take): the delete's _DROP_LEASES cannot see the take.
    The delete waits for the claim, so the attempt was under way before the 204, and its outcome is
    not recorded. Before, the delete returned first, then the claim committed the delivery in flight
    with its lease intact: sent after the 204, its outcome recorded on a deleted subscription."""
    org = Organization.create(id="org_1", slug="acme", created_at=1)
    subscription = create_subscription(org.id, "https://x.example/", None, 1)
    event_id = enqueue_test_ping(subscription, "KEYID", 1).id
    claims, claimed_at_204 = [], []

    def delete():
        delete_subscription(subscription, 3)
        claimed_at_204.append(delivery_of(event_id).state == Delivery.IN_FLIGHT)

    errors = race_behind(
        postgres_url, [("LOCK TABLE event IN ACCESS EXCLUSIVE MODE", ())],
        (connected(lambda: claims.extend(claim_due(2, 10, 1000))), sessions_waiting(1)),
        (connected(delete), lambda watcher: sessions_waiting(2)(watcher) or claimed_at_204))
    assert errors == []
    [claim] = claims
    recorded = support.record_attempt(claim, result, 4, 5, RetryPolicy([60], 20), 0)
    assert (claimed_at_204, recorded.recorded, Failure.select().count()) == ([True], False, 0)
    assert delivery_of(event_id).state == Delivery.IN_FLIGHT  # no retry: left for the purge


def test_a_key_rotation_never_waits_in_a_cycle_with_a_batch_of_outcomes(database, postgres_url):
    """`flask encryption rotate` re-seals subscriptions in batches, in id order, while the service
    runs; a batch of outcomes (group_commit) locks each attempt's delivery and then its subscription,
    in id order. Were it to hold the higher id's subscription and wait for the lower one (as batches
    did before they sorted), a rotation that then held the lower one while it waited for the higher
    would close the cycle: it passes over a row another transaction holds, and comes back for it.

    The batch queues for the lower subscription's held delivery; the rotation starts, and either
    re-seals the lower subscription or (before) waits for the higher one."""
    org = Organization.create(id="org_1", slug="acme", created_at=1)
    low, high = sorted((create_subscription(org.id, "https://x.example/", None, 1) for _ in range(2)),
                       key=lambda subscription: subscription.id)
    for subscription in (low, high):
        enqueue_test_ping(subscription, "KEYID", 1)
    claims = {claim.subscription_id: claim for claim in claim_due(1, 10, 1000)}
    sealing.use(sealing.keyring_of([support.NEW_ENCRYPTION_KEY, *support.ENCRYPTION_KEYS]))
    new_key_id = sealing.keyring().sealing_id

    def low_resealed(watcher) -> bool:
        with watcher.cursor() as cursor:
            cursor.execute("SELECT secret_key_id FROM subscription WHERE id = %s", (low.id,))
            return cursor.fetchone()[0] == new_key_id

    batch = [Outcome(claims[high.id], FAILED, 2, 7), Outcome(claims[low.id], FAILED, 2, 7)]
    recorded = []
    errors = race_behind(
        postgres_url, held_delivery(claims[low.id].event_id),
        (connected(lambda: recorded.extend(write_outcomes(batch, RetryPolicy([60], 20)))), sessions_waiting(1)),
        (connected(resealing.rotate), lambda watcher: sessions_waiting(2)(watcher) or low_resealed(watcher)))
    assert errors == []
    assert [outcome.recorded for outcome in recorded] == [True, True] and Failure.select().count() == 2
    assert {subscription.secret_key_id for subscription in Subscription.select()} == {new_key_id}


def test_a_batch_of_outcomes_takes_its_subscriptions_lowest_id_first(database, postgres_url):
    """A batch of outcomes (group_commit) locks its subscriptions in id order, whatever order its
    statement meets them in: so two services' batches for the same subscriptions never hold one each
    while waiting for the other's. Before, each took them in the order the plan met them, and in most
    drains by two services PostgreSQL rolled one back as a deadlock (bench/scale_out), each stalling both
    services' outcomes for deadlock_timeout.

    Here the statement meets the higher id first (its row is first in the table), and a session of the
    test's own holds that one: while the batch waits for it, it already holds the lower one."""
    org = Organization.create(id="org_1", slug="acme", created_at=1)
    low, high = sorted((create_subscription(org.id, "https://x.example/", None, 1) for _ in range(2)),
                       key=lambda subscription: subscription.id)
    Subscription.update(description="after").where(Subscription.id == low.id).execute()  # its row after high's
    for subscription in (low, high):
        enqueue_test_ping(subscription, "KEYID", 1)
    batch = [Outcome(claim, OK, 2, 7) for claim in claim_due(1, 10, 1000)]
    holder, watcher = psycopg2.connect(postgres_url), psycopg2.connect(postgres_url)
    watcher.autocommit = True
    recorded, errors = [], []
    try:
        holder.cursor().execute("SELECT 1 FROM subscription WHERE id = %s FOR NO KEY UPDATE", (high.id,))
        writer = support.in_thread(connected(lambda: recorded.extend(write_outcomes(batch, RetryPolicy([60], 20)))),
                                   errors)
        assert support.eventually(lambda: sessions_waiting(1)(watcher))
        with pytest.raises(psycopg2.errors.LockNotAvailable), watcher.cursor() as cursor:
            cursor.execute("SELECT 1 FROM subscription WHERE id = %s FOR NO KEY UPDATE NOWAIT", (low.id,))
        holder.commit()
        writer.join(10)
    finally:
        holder.close()
        watcher.close()
    assert errors == [] and [outcome.recorded for outcome in recorded] == [True, True]


OK = AttemptResult(True, 200, None, "", 5)


def test_a_ping_racing_a_delete_and_its_purge_is_404_not_500(client, auth, subscribe, postgres_url):
    """The test trigger holds the subscription from its check to its enqueue: a delete, its purge or
    an auto-disable that commits meanwhile is seen (404, 409), where the ping's event used to meet a
    foreign key to a row that was gone (a 500)."""
    subscription = subscribe(support.PUBLIC_URL)
    responses = []
    gone = [("UPDATE subscription SET deleted_at = 3 WHERE id = %s", (subscription["id"],)),
            ("DELETE FROM subscription WHERE id = %s", (subscription["id"],))]
    errors = race_behind(postgres_url, gone,
                         (lambda: responses.append(support.ping_as(client, auth, subscription)), sessions_waiting(1)))
    assert errors == []
    support.assert_problem(responses[0], 404, "not_found")


def test_a_deadlock_is_a_503_to_retry_not_an_outage(app, client, auth, subscribe, postgres_url, caplog):
    """PostgreSQL ends a deadlock by rolling one transaction back: the partner gets the 503 to retry,
    but the database answers, so no outage is logged and /readyz stays ready. Here a session of the
    test's own holds the subscription, the partner's delete takes the delivery and waits for the
    subscription, and the session then asks for the delivery: the delete is the one rolled back."""
    subscription = subscribe(support.PUBLIC_URL)
    assert support.ping_as(client, auth, subscription).status_code == 202
    with db.connection_context():
        [claim] = claim_due(10**13, 1, 1000)
    holder, watcher = psycopg2.connect(postgres_url), psycopg2.connect(postgres_url)
    watcher.autocommit = True
    try:
        held = holder.cursor()
        held.execute("SET deadlock_timeout = '10s'")  # the delete's session finds the cycle first
        held.execute("UPDATE subscription SET description = 'held' WHERE id = %s", (subscription["id"],))
        responses, errors = [], []
        delete = support.in_thread(lambda: responses.append(
            client.delete(f"{support.WEBHOOKS}/{subscription['id']}", headers=auth)), errors)
        assert support.eventually(lambda: sessions_waiting(1)(watcher))
        held.execute("SELECT 1 FROM delivery WHERE event_id = %s FOR UPDATE", (claim.event_id,))
        delete.join(10)
    finally:
        holder.close()
        watcher.close()
    assert errors == []
    support.assert_unavailable(responses[0])
    assert client.get("/readyz").status_code == 200
    logged = [record.getMessage() for record in caplog.records]
    assert any("rolled back by the database" in line for line in logged)
    assert not [line for line in logged if "unavailable" in line]
    assert client.delete(f"{support.WEBHOOKS}/{subscription['id']}", headers=auth).status_code == 204


def test_an_operator_command_rolled_back_by_a_deadlock_says_so_in_one_line(app, client, auth, subscribe,
                                                                             postgres_url):
    """A replay holds the subscription and then writes its dead letters; a session of the test's own
    holds a dead letter and then asks for the subscription: PostgreSQL rolls the replay back."""
    subscription = subscribe(support.PUBLIC_URL)
    event_id = support.ping_as(client, auth, subscription).get_json()["id"]
    with db.connection_context():
        Delivery.update(state=Delivery.DEAD, due_at=None).where(Delivery.event == event_id).execute()
    holder, watcher = psycopg2.connect(postgres_url), psycopg2.connect(postgres_url)
    watcher.autocommit = True
    try:
        held = holder.cursor()
        held.execute("SET deadlock_timeout = '10s'")  # the command's session finds the cycle first
        held.execute("UPDATE delivery SET attempts = attempts WHERE event_id = %s", (event_id,))
        results, errors = [], []
        replay = support.in_thread(lambda: results.append(app.test_cli_runner().invoke(
            args=["deliveries", "replay", "--subscription", subscription["id"]])), errors)
        assert support.eventually(lambda: sessions_waiting(1)(watcher))
        held.execute("SELECT 1 FROM subscription WHERE id = %s FOR UPDATE", (subscription["id"],))
        replay.join(10)
    finally:
        holder.close()
        watcher.close()
    assert errors == [] and results[0].exit_code == 1
    assert "Error: the database could not complete the command: OperationalError: deadlock detected" in \
        results[0].output, results[0].output
    assert isinstance(results[0].exception, SystemExit)  # a ClickException's exit, not the database error


def test_a_key_rotation_waits_for_a_held_row_and_says_so(database, postgres_url, caplog):
    """A subscription row held for long (an idle transaction elsewhere) is passed over, then waited
    for, with a line in the log each second; once it is let go, the rotation re-seals it and ends."""
    org = Organization.create(id="org_1", slug="acme", created_at=1)
    held, other = (create_subscription(org.id, "https://x.example/", None, 1) for _ in range(2))
    sealing.use(sealing.keyring_of([support.NEW_ENCRYPTION_KEY, *support.ENCRYPTION_KEYS]))

    def waiting_for_it(_watcher) -> bool:
        return any("1 webhook secrets are in rows other transactions hold" in record.getMessage()
                   for record in caplog.records)
    rotated = []
    errors = race_behind(postgres_url, [("SELECT 1 FROM subscription WHERE id = %s FOR UPDATE", (held.id,))],
                         (connected(lambda: rotated.append(resealing.rotate())), waiting_for_it))
    assert errors == []
    assert rotated[0].resealed == 2
    assert {s.secret_key_id for s in Subscription.select()} == {rotated[0].key_id}
    assert [secret_of(s) for s in Subscription.select().order_by(Subscription.id)] == \
        [secret_of(s) for s in sorted((held, other), key=lambda s: s.id)]


def test_two_first_keys_of_one_organization_share_it(database, postgres_url):
    """Two operators issue the first key of a new organization at once: the second waits for the
    first's organization and joins it, where it used to fail on the unique slug with a traceback."""
    issued = []
    errors = race_behind(
        postgres_url, [("INSERT INTO organization (id, slug, created_at) VALUES ('org_first', 'newco', 1)", ())],
        (connected(lambda: issued.append(create_key("newco", ["webhooks:manage"], 2))), sessions_waiting(1)))
    assert errors == []
    assert issued[0].key.organization_id == "org_first"
    assert [org.id for org in Organization.select().where(Organization.slug == "newco")] == ["org_first"]


def behind_a_revocation(postgres_url: str, key_id: str, command):
    """What `command(key_id, 7)` returns, run while another session revokes the key at 5 and commits
    once the command waits for it."""
    returned = []
    errors = race_behind(
        postgres_url, [("UPDATE api_key SET revoked_at = 5 WHERE key_id = %s", (key_id,))],
        (connected(lambda: returned.append(command(key_id, 7))), sessions_waiting(1)))
    assert errors == []
    return returned[0]


def test_a_rotation_racing_a_revoke_of_its_key_issues_nothing(database, postgres_url):
    """An operator rotates a key while another revokes it: the rotation waits for the revoke and
    then finds no active key to rotate, where it used to issue a new key for a revoked one."""
    old = create_key("acme", ["webhooks:manage"], 1).key
    assert behind_a_revocation(postgres_url, old.key_id, rotate_key) is None
    assert [(key.key_id, key.revoked_at) for key in ApiKey.select()] == [(old.key_id, 5)]


def test_a_revocation_racing_another_keeps_the_first_time(database, postgres_url):
    """Revoking twice keeps the first time, also when the second waits for the first to commit."""
    key = create_key("acme", ["webhooks:manage"], 1).key
    assert behind_a_revocation(postgres_url, key.key_id, revoke_key).revoked_at == 5
    assert ApiKey.get_by_id(key.key_id).revoked_at == 5
