"""`flask db backup` / `flask db restore` (docs/data.md) as an operator runs them, beside a real
gunicorn that accepts and delivers pings throughout."""

import re
import sqlite3
import subprocess

import pytest

from models import db
from tests.support import open_database
from partner.store import backup, migrations
from partner.errors import OperatorError
from partner.keys import create_key
from tests.gunicorn_server import STOP_SECONDS, Gunicorn, PingLoad, flask, run_flask
from tests.receivers import Receiver, late
from tests.support import eventually
from tests.test_migrations import assert_no_plaintext_secret, build_release

FEEDERS = 4
LATEST = migrations.number(migrations.names()[-1])


def flask_db(env, *args: str) -> subprocess.CompletedProcess:
    return run_flask(env, "db", *args)


def rows(path, sql: str) -> list:
    with sqlite3.connect(path) as connection:
        return connection.execute(sql).fetchall()


def test_a_backup_under_load_restores_every_acknowledged_event_and_delivers_the_pending_ones(
        server_env, session, tmp_path):
    # One attempt in flight per subscription to a receiver slower than the pings come in: a backlog builds up.
    server_env.update(PARTNER_WEBHOOK_ALLOWED_NETWORKS='["127.0.0.0/8"]', PARTNER_DELIVERY_POLL_INTERVAL="0.05",
                      PARTNER_DELIVERY_MAX_PER_SUBSCRIPTION="1")
    receiver = Receiver(script=[late(0.2)]).start()
    live = Gunicorn(server_env, tmp_path / "live")
    restored, load = None, None
    try:
        live.wait_until_serving(session)
        key = flask(server_env, "keys", "create", "--org", "load", "--scope", "webhooks:manage",
                    "--rate-limit", "1000000")
        # ~20 pings a second per subscription against ~5 deliveries: a backlog, not a flood.
        load = PingLoad(live.base_url, key, receiver.url, FEEDERS, pause=0.05)
        assert eventually(lambda: len(load.events) - len(receiver.received) >= 20)  # a backlog of 20
        acknowledged = set(load.events)  # every 202 answered before the backup began
        path = tmp_path / "backup.sqlite3"
        made = flask_db(server_env, "backup", str(path))
        accepted, sent = len(load.events), len(receiver.received)
        # Still accepting and delivering after it.
        assert eventually(lambda: len(load.events) > accepted + 5 and len(receiver.received) > sent + 2)
        load.stop()
        assert made.returncode == 0, made.stderr
        assert re.fullmatch(rf"backup {path}: \d+ bytes, schema \d+, integrity ok", made.stdout.splitlines()[-1])
        assert set(load.answers) == {202} and len(load.events) > len(acknowledged) > 0
        assert live.stop() == 0

        fresh = {**server_env, "PARTNER_DATABASE_URL": f"sqlite:///{tmp_path}/fresh/partner.sqlite3"}
        (tmp_path / "fresh").mkdir()
        put = flask_db(fresh, "restore", str(path))
        assert put.returncode == 0, put.stderr
        database = tmp_path / "fresh" / "partner.sqlite3"
        stored = [event_id for (event_id,) in rows(database, "SELECT id FROM event")]
        assert len(stored) == len(set(stored))  # none twice
        assert acknowledged <= set(stored)
        assert rows(database, "PRAGMA integrity_check") == [("ok",)]
        assert_no_plaintext_secret(f"sqlite:///{database}")
        pending = {e for (e,) in rows(database, "SELECT event_id FROM delivery WHERE state = 'pending'")}
        assert pending  # the receiver was slower than the pings: a backlog was in the backup

        restored = Gunicorn(fresh, tmp_path / "restored")
        restored.wait_until_serving(session)
        assert eventually(lambda: not still_pending(database, pending), seconds=30, pause=0.2)
    finally:
        if load is not None:
            load.stop()
        for server in (live, restored):
            if server is not None and server.process.poll() is None:
                server.process.kill()
                server.process.wait(timeout=STOP_SECONDS)
        receiver.stop()


def still_pending(database, events: set) -> set:
    delivered = {e for (e,) in rows(database, "SELECT event_id FROM delivery WHERE state = 'delivered'")}
    return events - delivered


@pytest.fixture
def backed_up(server_env, tmp_path) -> str:
    """A backup of a database with a key in it."""
    open_database(server_env["PARTNER_DATABASE_URL"]).close_all()  # as the service's first start makes it
    flask(server_env, "keys", "create", "--org", "acme")
    path = str(tmp_path / "backup.sqlite3")
    assert flask_db(server_env, "backup", path).returncode == 0
    return path


def test_restore_is_refused_while_a_service_has_the_database_open(server_env, backed_up, session, tmp_path):
    service = Gunicorn(server_env, tmp_path / "serving")
    try:
        service.wait_until_serving(session)
        refused = flask_db(server_env, "restore", backed_up)
        assert refused.returncode == 1
        assert refused.stderr.strip().splitlines() == [
            f"Error: {server_env['PARTNER_DATABASE_URL'].removeprefix('sqlite:///')} is open in a running "
            f"service: stop every service process first"]
    finally:
        service.stop()
    put = flask_db(server_env, "restore", backed_up)
    assert put.returncode == 0, put.stderr
    assert [line for line in put.stdout.splitlines() if line.startswith("moved aside: ")]


def test_a_backup_never_overwrites_and_a_bad_copy_is_never_restored(server_env, backed_up, tmp_path):
    assert flask_db(server_env, "backup", backed_up).returncode == 1
    corrupt = tmp_path / "corrupt.sqlite3"
    data = bytearray(open(backed_up, "rb").read())
    page = int.from_bytes(data[16:18], "big")
    for start in range(page, len(data), page):  # every page's B-tree header damaged
        data[start:start + 12] = b"\x0d\xff\xff" * 4
    corrupt.write_bytes(bytes(data))
    refused = flask_db(server_env, "restore", str(corrupt))
    assert refused.returncode == 1 and str(corrupt) in refused.stderr
    newer = tmp_path / "newer.sqlite3"
    newer.write_bytes(open(backed_up, "rb").read())
    with sqlite3.connect(newer) as connection:
        connection.execute("INSERT INTO schema_migration (name, applied) VALUES ('9999_future', '2030-01-01')")
    refused = flask_db(server_env, "restore", str(newer))
    assert refused.returncode == 1 and "newer than this code" in refused.stderr


def test_a_backup_that_cannot_be_written_is_refused_in_one_line(server_env, backed_up, tmp_path):
    (tmp_path / "a-file").write_text("")
    for directory, why in (("missing", "does not exist"), ("a-file", "is not a directory")):
        target = tmp_path / directory / "copy.sqlite3"
        refused = flask_db(server_env, "backup", str(target))
        assert refused.returncode == 1
        assert refused.stderr.strip().splitlines() == [
            f"Error: the backup to {target} failed: {target.parent} {why}"], refused.stderr


@pytest.mark.parametrize("command", ["backup", "restore"])
def test_on_postgresql_the_commands_point_to_pg_dump(server_env, postgres_url, command, tmp_path):
    refused = flask_db({**server_env, "PARTNER_DATABASE_URL": postgres_url}, command, str(tmp_path / "x"))
    assert refused.returncode == 1 and "pg_dump" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1


def test_the_pre_upgrade_backup_of_a_release_1_1_database_is_taken_by_the_new_code(server_env, tmp_path):
    """The upgrade runbook: back up with the new release's `flask db backup` before its first start."""
    build_release(server_env["PARTNER_DATABASE_URL"], "1.1")
    made = flask_db(server_env, "backup", str(tmp_path / "pre-upgrade.sqlite3"))
    assert made.returncode == 0, made.stderr
    assert made.stdout.splitlines()[-1].endswith(" bytes, schema 0, integrity ok")


ODD_NAMES = ["copy #1.sqlite3", "copy ?mode=rwc.sqlite3", "copy %41.sqlite3"]


@pytest.fixture
def database_file(tmp_path) -> str:
    """A database of the current schema, with a key in it, that no service holds open."""
    path = tmp_path / "db" / "partner.sqlite3"
    open_database(f"sqlite:///{path}")
    with db.connection_context():
        create_key("acme", ["webhooks:manage"], 0)
    db.close_all()
    return str(path)


@pytest.mark.parametrize("name", ODD_NAMES)
def test_a_backup_to_a_name_with_uri_characters_is_that_file_and_nothing_else(database_file, tmp_path, name):
    (tmp_path / "copies").mkdir()
    target = tmp_path / "copies" / name
    made = backup.backup(f"sqlite:///{database_file}", str(target))
    assert (made.path, made.version) == (str(target), LATEST)
    assert [p.name for p in (tmp_path / "copies").iterdir()] == [name]
    assert rows(target, "SELECT org.slug FROM api_key JOIN organization org ON org.id = organization_id") == [("acme",)]


@pytest.mark.parametrize("name", ["future#2.sqlite3", "future?2.sqlite3", "future%2.sqlite3"])
def test_a_newer_copy_is_not_restored_whatever_its_name(database_file, tmp_path, name):
    newer = tmp_path / name
    backup.backup(f"sqlite:///{database_file}", str(newer))
    with sqlite3.connect(newer) as connection:
        connection.execute("INSERT INTO schema_migration (name, applied) VALUES ('9999_future', '2030-01-01')")
    connection.close()
    before = open(database_file, "rb").read()
    with pytest.raises(OperatorError, match="newer than this code"):
        backup.restore(f"sqlite:///{database_file}", str(newer))
    assert open(database_file, "rb").read() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["db", name])


@pytest.mark.parametrize("operation", [backup.backup, backup.restore])
def test_an_in_memory_database_is_refused_for_having_no_file(operation, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(OperatorError, match="^the database is in memory: it has no file to back up or restore$"):
        operation("sqlite:///:memory:", str(tmp_path / "copy.sqlite3"))
    assert list(tmp_path.iterdir()) == []
