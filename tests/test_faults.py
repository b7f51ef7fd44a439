"""When the database cannot answer or write: 503 problem+json with Retry-After, nothing changed,
bounded waits, and reads never held behind writers."""

import sqlite3
import threading
import time

import pytest
from peewee import OperationalError, Table

from models import db
from partner import retention
from partner.store import sql as database
from partner.store.availability import is_unavailable
from tests.support import ME, PUBLIC_URL, SLACK_SECONDS, WEBHOOKS, assert_unavailable

NEW = {"url": PUBLIC_URL}


def timed(request):
    started = time.monotonic()
    response = request()
    return response, time.monotonic() - started


@pytest.fixture
def writer_lock_held():
    """Another thread of this process holds the SQLite writer lock and does not let go (a writer stuck
    in SQLite's busy handler behind a lock held from outside)."""
    taken, release = threading.Event(), threading.Event()

    def hold():
        with database._SQLITE_WRITER:
            taken.set()
            release.wait(30)
    thread = threading.Thread(target=hold)
    thread.start()
    taken.wait()
    yield release  # set it to let go
    release.set()
    thread.join()


@pytest.fixture
def brief_writer_wait(monkeypatch):
    """The writer lock's wait (1 s in the product) at 0.1 s: each write refused waits it out."""
    monkeypatch.setattr(database, "WRITER_WAIT_SECONDS", 0.1)


def test_a_write_that_cannot_get_the_writer_lock_gives_up_with_503(client, auth, writer_lock_held, brief_writer_wait):
    response, seconds = timed(lambda: client.post(WEBHOOKS, json=NEW, headers=auth))
    assert_unavailable(response)
    assert database.WRITER_WAIT_SECONDS <= seconds < database.WRITER_WAIT_SECONDS + SLACK_SECONDS  # not the 30 s held


def test_reads_never_wait_for_the_writer_lock(client, auth, writer_lock_held, monkeypatch):
    monkeypatch.setattr(database, "WRITER_WAIT_SECONDS", 30)  # what a read waiting for the lock would wait
    response, seconds = timed(lambda: client.get(ME, headers=auth))
    assert response.status_code == 200
    assert seconds < SLACK_SECONDS
    assert client.get(WEBHOOKS, headers=auth).get_json()["data"] == []


@pytest.fixture
def locked_from_outside(tmp_path):
    """Another process's connection (here: another connection) holds SQLite's write lock."""
    outside = sqlite3.connect(tmp_path / "partner.sqlite3", isolation_level=None)
    outside.execute("BEGIN IMMEDIATE")
    yield
    outside.execute("ROLLBACK")
    outside.close()


def test_sqlite_locked_from_outside_is_503_and_nothing_changes(brief_busy_timeout, client, auth, locked_from_outside):
    assert_unavailable(client.post(WEBHOOKS, json=NEW, headers=auth))
    response, seconds = timed(lambda: client.get(WEBHOOKS, headers=auth))
    assert (response.status_code, response.get_json()["data"]) == (200, [])  # a read that wrote would be a 503
    assert seconds < SLACK_SECONDS


def test_the_write_goes_through_once_the_lock_is_released(client, auth, tmp_path):
    outside = sqlite3.connect(tmp_path / "partner.sqlite3", isolation_level=None, check_same_thread=False)
    outside.execute("BEGIN IMMEDIATE")
    threading.Timer(0.3, outside.execute, ("ROLLBACK",)).start()
    assert client.post(WEBHOOKS, json=NEW, headers=auth).status_code == 201  # within the busy timeout
    outside.close()


def test_the_outage_is_logged_once_and_its_end_once_a_write_commits(client, auth, writer_lock_held, brief_writer_wait,
                                                                    caplog):
    for _ in range(3):
        assert_unavailable(client.post(WEBHOOKS, json=NEW, headers=auth))
        assert client.get(ME, headers=auth).status_code == 200  # reads answer: the outage goes on
    writer_lock_held.set()
    assert client.post(WEBHOOKS, json=NEW, headers=auth).status_code == 201
    lines = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "partner.store.availability"]
    assert [level for level, _ in lines] == ["ERROR", "WARNING"], lines
    assert lines[0][1].startswith("database unavailable (DatabaseBusy: ")
    assert lines[1][1].startswith("database answers again after ") and "(3 failures meanwhile)" in lines[1][1]


@pytest.mark.parametrize("message, unavailable", [
    ("database is locked", True), ("database or disk is full", True), ("disk I/O error", True),
    ("unable to open database file", True), ("attempt to write a readonly database", True),
    ("no such table: nope", False), ('near "SELEC": syntax error', False),
])
def test_only_sqlite_errors_of_the_storage_are_unavailability(app, message, unavailable):
    from peewee import OperationalError
    assert is_unavailable(OperationalError(message)) is unavailable


def test_a_bug_in_sql_is_still_a_500_not_a_503(app):
    @app.get("/bad-sql")
    def bad_sql():
        db.execute_sql("SELECT * FROM no_such_table")

    response = app.test_client().get("/bad-sql")
    assert (response.status_code, response.get_json()["code"]) == (500, "internal_error")


@pytest.mark.both_databases
def test_a_programming_error_of_peewee_is_a_500_and_a_closed_postgresql_connection_a_503(app, backend):
    @app.get("/unbound-query")
    def unbound_query():
        Table("setting").select().execute()  # peewee's InterfaceError: the query has no database

    @app.get("/closed-connection")
    def closed_connection():
        db.connection().close()  # as a PostgreSQL restart leaves it
        db.execute_sql("SELECT 1")

    client = app.test_client()
    response = client.get("/unbound-query")
    assert (response.status_code, response.get_json()["code"]) == (500, "internal_error")
    if backend == "postgresql":
        assert_unavailable(client.get("/closed-connection"))


def test_a_write_probe_says_why_a_write_does_not_commit_now(brief_busy_timeout, app, locked_from_outside):
    started = time.monotonic()
    with db.connection_context(), pytest.raises(OperationalError, match="database is locked"):
        database.probe_write()  # past SQLite's busy timeout
    assert time.monotonic() - started < SLACK_SECONDS  # the lock is held until the test ends


def test_a_write_probe_commits_on_a_healthy_database(app):
    with db.connection_context():
        database.probe_write()
        assert db.execute_sql("SELECT value FROM setting WHERE name = 'write_probe'").fetchone()


def test_the_daily_run_waits_for_its_next_hour_while_the_database_is_locked(brief_busy_timeout, app, clock):
    holder = sqlite3.connect(app.config["DATABASE_URL"].removeprefix("sqlite:///"), isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # an operator's shell holding the write lock
    try:
        with app.app_context():
            assert retention.run_daily(clock, 30) is None  # not raised: the scheduler would log a traceback
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    with app.app_context():
        assert retention.run_daily(clock, 30) is not None
