"""Reads kept until the next commit (read_cache.py): a commit anywhere, by any process, is seen at
the very next read; nothing is kept where that cannot be known at once."""

import os
import sqlite3
import subprocess
import sys

import pytest

import read_cache
from keys import parse_key
from models import db, remembered, run_sql, write_transaction
from read_cache import CommitWatch, ReadCache
from tests.gunicorn_server import Gunicorn, flask
from tests.support import ME, PUBLIC_IP, WEBHOOKS, bearer, free_port


def commit_from_another_process(path, sql="INSERT INTO t VALUES (1)") -> None:
    """A plain sqlite3 connection in a process of its own commits `sql`."""
    script = f"import sqlite3; c = sqlite3.connect({str(path)!r}); c.execute({sql!r}); c.commit(); c.close()"
    subprocess.run([sys.executable, "-c", script], check=True, timeout=30)


@pytest.fixture
def wal_database(tmp_path):
    path = tmp_path / "watched.sqlite3"
    connection = sqlite3.connect(path)
    connection.execute("PRAGMA journal_mode=wal")
    connection.execute("CREATE TABLE t (a)")
    connection.commit()
    connection.close()
    return path


class CountingRead:
    def __init__(self, value="row"):
        self.value, self.calls = value, 0

    def __call__(self):
        self.calls += 1
        return self.value


def test_a_value_is_kept_until_another_process_commits(wal_database):
    cache, read = ReadCache(str(wal_database)), CountingRead()
    assert [cache.get("k", read) for _ in range(3)] == ["row"] * 3
    assert read.calls == 1
    commit_from_another_process(wal_database)
    assert cache.get("k", read) == "row" and read.calls == 2
    assert cache.get("k", read) == "row" and read.calls == 2


def test_a_commit_forgets_every_value_and_a_rolled_back_write_forgets_none(wal_database):
    cache, first, second = ReadCache(str(wal_database)), CountingRead(), CountingRead()
    cache.get("first", first), cache.get("second", second)
    writer = sqlite3.connect(wal_database)
    writer.execute("INSERT INTO t VALUES (1)")
    writer.rollback()
    cache.get("first", first), cache.get("second", second)
    assert (first.calls, second.calls) == (1, 1)
    writer.execute("INSERT INTO t VALUES (1)")
    writer.commit()
    cache.get("first", first), cache.get("second", second)
    assert (first.calls, second.calls) == (2, 2)


def test_a_database_locked_from_outside_is_read_each_time_without_waiting(tmp_path):
    """A watch that cannot begin a read at once answers None (it has no busy timeout: it runs with
    the interpreter lock held), and the value is read from the database, not kept."""
    path = tmp_path / "rollback-journal.sqlite3"  # a writer there locks readers out; WAL's cannot
    sqlite3.connect(path).execute("CREATE TABLE t (a)").connection.close()
    cache, read = ReadCache(str(path)), CountingRead()
    cache.get("k", read)
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("BEGIN EXCLUSIVE")
    writer.execute("INSERT INTO t VALUES (1)")
    assert CommitWatch(str(path)).state() is None
    cache.get("k", read), cache.get("k", read)
    assert read.calls == 3
    writer.execute("COMMIT")
    cache.get("k", read), cache.get("k", read)
    assert read.calls == 4


def test_nothing_is_kept_without_a_database_file(tmp_path, caplog):
    for path in (None, str(tmp_path / "absent.sqlite3")):
        cache, read = ReadCache(path), CountingRead()
        cache.get("k", read), cache.get("k", read)
        assert read.calls == 2
    assert "absent.sqlite3 are not cached: SQLite: unable to open database file" in caplog.text
    assert not (tmp_path / "absent.sqlite3").exists()


def test_none_is_never_kept_and_one_state_keeps_at_most_max_rows(wal_database, monkeypatch):
    monkeypatch.setattr(read_cache, "MAX_ROWS", 3)
    cache, missing, read = ReadCache(str(wal_database)), CountingRead(None), CountingRead()
    cache.get("missing", missing), cache.get("missing", missing)
    assert missing.calls == 2
    for key, rows in (("page", 2), ("key", 1), ("another", 1), ("another", 1), ("page", 2), ("key", 1)):
        cache.get(key, read, rows)
    assert read.calls == 4  # the page and the key kept; the third value, over the budget, read each time


def test_a_commit_while_a_value_is_read_makes_the_next_get_read_again(wal_database):
    """The state is taken before the read: a commit racing the read is never hidden by it."""
    cache, calls = ReadCache(str(wal_database)), []

    def read_then_commit():
        calls.append("read")
        if len(calls) == 1:
            commit_from_another_process(wal_database)  # lands after the value was read
        return "row"
    cache.get("k", read_then_commit), cache.get("k", read_then_commit), cache.get("k", read_then_commit)
    assert calls == ["read", "read"]


def test_a_replaced_database_file_is_watched_again(wal_database, tmp_path):
    cache, read = ReadCache(str(wal_database)), CountingRead()
    cache.get("k", read)
    replacement = tmp_path / "restored.sqlite3"
    sqlite3.connect(wal_database).execute(f"VACUUM INTO '{replacement}'").connection.close()
    os.replace(replacement, wal_database)  # an operator restoring a backup over the live file
    cache.get("k", read)
    assert read.calls == 2
    commit_from_another_process(wal_database)
    cache.get("k", read), cache.get("k", read)
    assert read.calls == 3


def test_a_database_whose_name_is_not_utf8_is_watched(tmp_path):
    path = tmp_path / os.fsdecode(b"caf\xe9.sqlite3")
    sqlite3.connect(path).execute("CREATE TABLE t (a)").connection.close()
    cache, read = ReadCache(str(path)), CountingRead()
    cache.get("k", read), cache.get("k", read)
    assert read.calls == 1
    commit_from_another_process(path)
    cache.get("k", read)
    assert read.calls == 2


def test_a_process_forked_from_the_one_that_opened_the_database_keeps_nothing(wal_database):
    """SQLite's file locks belong to the process that took them: a forked child cannot watch
    reliably, so it reads every time (gunicorn's workers open the database themselves)."""
    cache, read = ReadCache(str(wal_database)), CountingRead()
    cache.get("k", read)
    child = os.fork()
    if child == 0:
        cache.get("k", read), cache.get("k", read)
        os._exit(0 if read.calls == 3 else 1)
    assert os.waitpid(child, 0)[1] == 0
    cache.get("k", read)
    assert read.calls == 1  # the parent still keeps its value


def test_a_read_inside_a_transaction_is_never_kept(app):
    read = CountingRead()
    with app.app_context(), db.connection_context():
        with pytest.raises(RuntimeError), write_transaction():
            run_sql("INSERT INTO setting (name, value) VALUES ('x', '1')", ())
            remembered("k", read)
            raise RuntimeError("rolled back")
        remembered("k", read), remembered("k", read)
    assert read.calls == 2  # the first read saw a row that was never committed


@pytest.mark.both_databases
def test_only_sqlite_keeps_values(app, backend):
    read = CountingRead()
    with app.app_context():
        remembered("k", read), remembered("k", read)
    assert read.calls == (1 if backend == "sqlite" else 2)


def test_every_process_sees_a_revocation_or_a_change_from_another_process_at_the_next_request(
        server_env, smoke_key, tmp_path, session):
    """Two gunicorns on one database (a worker each), both having read the keys and the page."""
    servers = [Gunicorn(dict(server_env, PORT=str(free_port())), tmp_path / f"server{n}")
               for n in range(2)]
    database_path = server_env["PARTNER_DATABASE_URL"].removeprefix("sqlite:///")
    other_key = flask(server_env, "keys", "create", "--org", "smoke", "--scope", "webhooks:manage")
    try:
        for server in servers:
            server.wait_until_serving(session)

        def statuses(key) -> set[int]:
            return {session.get(server.base_url + ME, headers=bearer(key), timeout=5).status_code
                    for server in servers for _ in range(2)}

        def failures_shown() -> set[int]:
            return {session.get(server.base_url + WEBHOOKS, headers=bearer(smoke_key), timeout=5)
                    .json()["data"][0]["consecutive_failures"] for server in servers for _ in range(2)}

        created = session.post(servers[0].base_url + WEBHOOKS, headers=bearer(smoke_key), timeout=5,
                               json={"url": f"https://{PUBLIC_IP}/hook"})  # never sent anything
        assert created.status_code == 201
        assert statuses(smoke_key) == statuses(other_key) == {200}
        assert failures_shown() == {0}
        commit_from_another_process(database_path, "UPDATE subscription SET consecutive_failures = 7")
        assert failures_shown() == {7}

        flask(server_env, "keys", "revoke", parse_key(smoke_key)[0])
        assert statuses(smoke_key) == {401}
        commit_from_another_process(database_path, "UPDATE api_key SET revoked_at = 1")
        assert statuses(other_key) == {401}
    finally:
        for server in servers:
            assert server.stop() == 0
