"""Deleting a subscription: gone for the partner at once (a tombstone), its history purged later in
short batches (retention.purge_deleted), and nobody else waits for it."""

import sqlite3
import threading
import time

import pytest

from models import Delivery, Event, Failure, Subscription, db
from partner.outbox import claim_due
from partner.events import CHUNK
from partner.retention import purge_deleted
from partner.store.sql import run_sql
from partner.subscriptions import subscriptions_overview
from tests.support import SLACK_SECONDS, WEBHOOKS, assert_problem, bearer, eventually, history_of, json_of, ping_as

LEASE = 40_000


@pytest.fixture
def config(config):
    config.setdefault("WEBHOOK_ALLOWED_NETWORKS", ["127.0.0.0/8"])
    return config


@pytest.fixture
def subscribe_receiver(client, auth, receiver):
    """subscribe_receiver(headers=auth): a subscription of that key's organization to the loopback
    receiver (only the test with a running scanner sends to it)."""
    def subscribe(headers=auth) -> dict:
        return json_of(client.post(WEBHOOKS, json={"url": receiver.url}, headers=headers), 201)
    return subscribe


def add_history(subscription_id: str, events: int, failures_each: int, now: int) -> None:
    """Finished events with many failure records each, written in bulk (rows of plain values: building
    a hundred thousand ORM rows would take most of the test's time)."""
    event_ids = [f"evt_bulk_{subscription_id}_{n}" for n in range(events)]
    with db.atomic():
        insert_rows("INSERT INTO event (id, kind, data, occurred_at, created_at) VALUES :rows",
                    [(e, "vc.test.ping", b"{}", now, now) for e in event_ids])
        insert_rows("INSERT INTO delivery (event_id, subscription_id, state) VALUES :rows",
                    [(e, subscription_id, "dead") for e in event_ids])
        insert_rows("INSERT INTO failure (id, subscription_id, event_id, attempt, error, response_excerpt, "
                    "duration_ms, attempted_at) VALUES :rows",
                    [(f"fail_{e}_{a}", subscription_id, e, 1, "timeout", "", 1, now)
                     for e in event_ids for a in range(failures_each)])


def insert_rows(template: str, rows: list[tuple]) -> None:
    """`template`'s `:rows`, a statement per CHUNK of them (each within SQLite's parameter limit)."""
    for start in range(0, len(rows), CHUNK):
        run_sql(template, {"rows": rows[start:start + CHUNK]})


def test_a_deleted_subscription_is_gone_at_once_and_its_history_later(app, client, auth, subscribe_receiver, clock):
    gone, kept = subscribe_receiver(), subscribe_receiver()
    for subscription in (gone, kept):
        assert ping_as(client, auth, subscription).status_code == 202
    with app.app_context(), db.connection_context():
        add_history(gone["id"], 10, 3, int(clock() * 1000))
    assert client.delete(f"{WEBHOOKS}/{gone['id']}", headers=auth).status_code == 204
    # Nothing purged yet (as after a crash right after the delete): still nothing visible.
    assert_problem(client.delete(f"{WEBHOOKS}/{gone['id']}", headers=auth), 404, "not_found")
    assert_problem(client.get(f"{WEBHOOKS}/{gone['id']}/failures", headers=auth), 404, "not_found")
    assert_problem(ping_as(client, auth, gone), 404, "not_found")
    assert [s["id"] for s in json_of(client.get(WEBHOOKS, headers=auth), 200)["data"]] == [kept["id"]]
    with app.app_context(), db.connection_context():
        assert [s.id for s in subscriptions_overview()] == [kept["id"]]
        assert {c.subscription_id for c in claim_due(int(clock() * 1000), 64, LEASE)} == {kept["id"]}
        assert history_of(gone["id"]) == [11, 11, 30]
        assert purge_deleted(batch=7) == 1
        assert history_of(gone["id"]) == [0, 0, 0]
        assert Subscription.get_or_none(Subscription.id == gone["id"]) is None
        assert history_of(kept["id"]) == [1, 1, 0]
        assert purge_deleted() == 0


def test_a_deleted_subscription_no_longer_counts_toward_the_cap(app, client, auth, subscribe_receiver):
    subscriptions = [subscribe_receiver() for _ in range(100)]
    assert client.delete(f"{WEBHOOKS}/{subscriptions[0]['id']}", headers=auth).status_code == 204
    subscribe_receiver()


def test_deleting_a_long_history_blocks_no_other_organization(app, client, auth, subscribe_receiver, issue_key, clock,
                                                              database_url):
    """The history goes in short transactions, the other organization's writes between them: a
    connection of the test's own sees it shrink in steps, not vanish at once."""
    doomed = subscribe_receiver()
    with app.app_context(), db.connection_context():
        add_history(doomed["id"], 3_000, 10, int(clock() * 1000))  # 30,000 failure records: 60 batches
    other = bearer(issue_key("other", rate_limit=100_000))
    theirs = subscribe_receiver(other)
    done, answers, left = threading.Event(), [], []
    watcher = sqlite3.connect(database_url.removeprefix("sqlite:///"))

    def delete_and_purge():
        try:
            assert client.delete(f"{WEBHOOKS}/{doomed['id']}", headers=auth).status_code == 204
            with app.app_context(), db.connection_context():
                purge_deleted()
        finally:
            done.set()

    deleter = threading.Thread(target=delete_and_purge)
    deleter.start()
    while not done.is_set():  # the other organization keeps writing meanwhile
        started = time.monotonic()
        status = ping_as(app.test_client(), other, theirs).status_code
        answers.append((status, time.monotonic() - started))
        left += watcher.execute("SELECT count(*) FROM failure WHERE subscription_id = ?", (doomed["id"],)).fetchone()
    deleter.join()
    watcher.close()
    assert {status for status, _ in answers} == {202}
    assert max(seconds for _, seconds in answers) < SLACK_SECONDS
    assert len(set(left) - {30_000, 0}) >= 3  # seen between batches, not all at once
    with app.app_context(), db.connection_context():
        assert history_of(doomed["id"]) == [0, 0, 0]


@pytest.mark.config(SCHEDULER_ENABLED=True)
def test_a_running_service_purges_a_deleted_subscription_at_once(app, client, auth, subscribe_receiver, clock):
    gone = subscribe_receiver()
    assert ping_as(client, auth, gone).status_code == 202
    dispatcher = app.extensions["delivery"]
    dispatcher.start()
    try:
        assert client.delete(f"{WEBHOOKS}/{gone['id']}", headers=auth).status_code == 204
        with app.app_context(), db.connection_context():
            assert eventually(lambda: Subscription.get_or_none(Subscription.id == gone["id"]) is None)
            assert history_of(gone["id"]) == [0, 0, 0]
    finally:
        dispatcher.stop()
