"""Schema versions (docs/data.md): every released database is recognised and brought forward with
every row intact, a fresh database has the same shape as the oldest one migrated, one process
migrates at a time, an up-to-date start runs no DDL, a scrub cut short is done later, and a database
newer than the code is refused."""

import base64
import os
import shutil
import signal
import urllib.parse
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from peewee import OperationalError
from playhouse.db_url import connect

from tests.support import started_app
from tests.support import open_database
from partner import sealing
from partner.store import migrations
from partner.store.sql import run_sql_on
from partner.errors import StartRefused
from tests import test_models, test_postgres
from models import Event, db
from partner.outbox import claim_due
from tests.fixtures.release_rows import RELEASES, ROWS, SECRETS, T, schema_sql
from tests.gunicorn_server import FLASK, ROOT, run_flask
from tests.support import free_port, run_together

pytestmark = pytest.mark.both_databases

LATEST = migrations.number(migrations.names()[-1])


def raw(database_url: str):
    """A plain peewee database at the URL, not bound to the models."""
    return connect(database_url)


def build_release(database_url: str, release: str) -> None:
    """A database exactly as release `release` left it: its schema.sql and realistic rows."""
    database = raw(database_url)
    with database.connection_context(), database.atomic():
        for statement in migrations.schema_statements(schema_sql(release)):
            database.execute_sql(statement)
        for table, rows in ROWS.items():
            for row in rows:
                names = ", ".join(f'"{name}"' for name in row)
                values = ", ".join(f":{name}" for name in row)
                run_sql_on(database, f'INSERT INTO "{table}" ({names}) VALUES ({values})', row)


# Columns a later release moved: since 1.4 an event names no subscription (its deliveries do).
MOVED = {"event": ("subscription_id",)}


def released_rows(table: str) -> list[dict]:
    """The fixture's rows of `table` as the latest schema holds them."""
    return [{name: value for name, value in row.items() if name not in MOVED.get(table, ())} for row in ROWS[table]]


def read_rows(database_url: str, table: str) -> list[dict]:
    """The table's rows as the fixtures spell them, a subscription's secret opened from its sealed form."""
    database = raw(database_url)
    names = [name for name in released_rows(table)[0] if name != "secret"]
    sealed = ["secret_key_id", "secret_sealed"] if table == "subscription" else []
    columns = ", ".join(f'"{name}"' for name in names + sealed)
    with database.connection_context():
        cursor = database.execute_sql(f'SELECT {columns} FROM "{table}" ORDER BY "{names[0]}"')
        return [normalized(dict(zip(names + sealed, row))) for row in cursor.fetchall()]


def normalized(row: dict) -> dict:
    """SQLite stores a boolean as 0/1, psycopg2 reads bytes as a view; a secret is stored sealed."""
    row = {name: (bool(value) if name == "active" else bytes(value) if name == "body" else value)
           for name, value in row.items()}
    if "secret_sealed" in row:
        row["secret"] = sealing.open_secret(row["id"], row.pop("secret_key_id"), row.pop("secret_sealed"))
    return row


def history(database_url: str) -> list[str]:
    database = raw(database_url)
    with database.connection_context():
        return [name for (name,) in database.execute_sql(
            f'SELECT name FROM "{migrations.HISTORY_TABLE}" ORDER BY name').fetchall()]


def shape(database_url: str, backend: str) -> dict:
    if backend == "sqlite":
        return test_models.describe(database_url.removeprefix("sqlite:///"))
    described = test_postgres.describe(raw(database_url))
    # A dropped column leaves a gap in PostgreSQL's ordinal positions: compare the columns' order.
    described["columns"] = [(table, *rest) for table, _position, *rest in described["columns"]]
    return described


@pytest.mark.parametrize("release", RELEASES)
def test_every_row_of_a_released_database_survives_the_upgrade(database_url, release):
    build_release(database_url, release)
    open_database(database_url)
    added = {"setting": [migrations.CURSOR_KEY]}  # what the upgrade adds: the key that seals cursors
    for table in ROWS:
        rows, found = released_rows(table), read_rows(database_url, table)
        assert [row.get("name", row) for row in found if row not in rows] == added.get(table, []), table
        assert [row for row in found if row in rows] == sorted(rows, key=lambda r: list(r.values())[0]), table
    assert_no_plaintext_secret(database_url)
    assert history(database_url) == migrations.names()  # every one recorded, whatever their numbers


@pytest.mark.parametrize("release", RELEASES)
def test_a_released_database_upgraded_has_the_shape_of_a_fresh_one(request, backend, database_url, release):
    build_release(database_url, release)
    open_database(database_url)
    fresh_url = request.getfixturevalue("second_database_url")
    open_database(fresh_url)
    assert shape(database_url, backend) == shape(fresh_url, backend)


@pytest.fixture
def second_database_url(backend, database_url, tmp_path, request):
    if backend == "postgresql":
        server = request.getfixturevalue("postgres_server")
        return server.url(server.create_schema())
    return f"sqlite:///{tmp_path}/second.sqlite3"


def test_processes_starting_together_migrate_once(database_url):
    build_release(database_url, "1.0")
    databases = [raw(database_url) for _ in range(6)]
    applied = []
    errors = run_together(*[lambda d=d: applied.extend(migrations.upgrade(d)) for d in databases])
    assert errors == []
    assert sorted(applied) == history(database_url)  # each migration applied by exactly one of them
    assert sorted(applied) == migrations.names()


def test_a_new_database_says_its_migrations_are_recorded_not_run(database_url, caplog):
    """The runner logs each migration of a new database as "up: … [FAKE]"; the line before says why."""
    caplog.set_level("INFO")
    open_database(database_url)
    lines = [record.getMessage() for record in caplog.records if record.name.startswith(("partner", "peewee"))]
    said = lines.index("new database: made from schema.sql; its migrations are recorded as applied, not run")
    assert lines[said + 1:] == [f"up: {name} [FAKE]" for name in migrations.names()]


@pytest.mark.servers  # flask commands, each in a process of its own
def test_a_database_newer_than_the_code_is_refused_and_left_untouched(database_url, caplog):
    open_database(database_url)
    future = raw(database_url)
    with future.connection_context():
        future.execute_sql(f'INSERT INTO "{migrations.HISTORY_TABLE}" (name, applied) '
                           f"VALUES ('{LATEST + 1:04d}_from_the_future', '2030-01-01')")
    before = history(database_url)
    with pytest.raises(StartRefused, match=f"version {LATEST + 1}, newer than this code's {LATEST}"):
        started_app({"DATABASE_URL": database_url, "SCHEDULER_ENABLED": False})
    assert history(database_url) == before
    refusals = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(refusals) == 1 and f"version {LATEST + 1}" in refusals[0]
    operator = flask_on(database_url, "keys", "list")  # an operator's command says the same, no more
    assert (operator.returncode, operator.stdout) == (1, "")
    assert operator.stderr.strip().splitlines() == refusals


@pytest.mark.servers  # flask commands, each in a process of its own
def test_an_operator_command_on_a_database_that_cannot_be_opened_says_why_in_one_line():
    url = f"postgresql://partner@127.0.0.1:{free_port()}/partner"  # nothing listens there
    operator = flask_on(url, "keys", "list")
    assert (operator.returncode, operator.stdout) == (1, "")
    [line] = operator.stderr.strip().splitlines()
    assert line.startswith(f"database {url} cannot be opened (OperationalError: connection to server at "), line
    assert line.endswith("the service cannot start until it can (PostgreSQL: check that the server is up, "
                         "reachable from this host, and takes the URL's user and password)"), line


def schema_cookie(path: str) -> int:
    """SQLite's schema version cookie: every DDL statement changes it."""
    with sqlite3.connect(path) as conn:
        return conn.execute("PRAGMA schema_version").fetchone()[0]


def test_a_start_on_an_up_to_date_database_runs_no_ddl(tmp_path):
    path = str(tmp_path / "partner.sqlite3")
    open_database(f"sqlite:///{path}")
    cookie = schema_cookie(path)
    started_app({"DATABASE_URL": f"sqlite:///{path}", "SCHEDULER_ENABLED": False})
    assert schema_cookie(path) == cookie


def flask_on(database_url: str, *args: str, key_file: Path | None = None, **options) -> subprocess.CompletedProcess:
    """An operator's `flask` command, in a process of its own, on the database at the URL; with
    `key_file`, configured with no keys (on SQLite the service then makes that file)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASK_")}
    if key_file:
        del env["PARTNER_ENCRYPTION_KEYS"]
        env["PARTNER_ENCRYPTION_KEY_FILE"] = str(key_file)
    return run_flask({**env, "PARTNER_DATABASE_URL": database_url}, *args, **options)


@pytest.mark.servers  # flask commands, each in a process of its own
def test_db_status_and_upgrade_as_an_operator_runs_them(database_url):
    build_release(database_url, "1.0")
    pending = flask_on(database_url, "db", "status")
    assert pending.returncode == 1, pending.stderr
    assert "pending: 0001_baseline" in pending.stdout
    upgraded = flask_on(database_url, "db", "upgrade")
    assert upgraded.returncode == 0 and "applied: 0001_baseline" in upgraded.stdout
    assert flask_on(database_url, "db", "upgrade").stdout.splitlines() == [
        "schema version unchanged: up to date"]
    assert flask_on(database_url, "db", "status").returncode == 0
    future = raw(database_url)
    with future.connection_context():
        future.execute_sql(f'INSERT INTO "{migrations.HISTORY_TABLE}" (name, applied) '
                           f"VALUES ('9999_future', '2030-01-01')")
    newer = flask_on(database_url, "db", "status")
    assert newer.returncode == 2 and "9999_future" in newer.stdout


@pytest.mark.servers  # flask commands, each in a process of its own
@pytest.mark.parametrize("launcher", [FLASK, (sys.executable, "-m", "flask")])
def test_db_status_changes_nothing_however_flask_is_launched(database_url, launcher):
    build_release(database_url, "1.0")
    for _ in range(2):  # still pending the second time: the first migrated nothing
        pending = flask_on(database_url, "db", "status", launcher=launcher)
        assert pending.returncode == 1 and "pending: 0001_baseline" in pending.stdout, pending.stderr


@pytest.mark.servers  # flask commands, each in a process of its own
@pytest.mark.parametrize("command", [("status",), ("upgrade",), ("backup", "copy.sqlite3")])
def test_a_schema_command_on_no_database_says_so_and_makes_none(tmp_path, command):
    path, key_file = tmp_path / "mistyped.sqlite3", tmp_path / "instance" / "encryption.key"
    result = flask_on(f"sqlite:///{path}", "db", *command, key_file=key_file)
    assert result.returncode == 1 and f"no database at {path}" in result.stderr, result.stderr
    assert not path.exists() and not key_file.parent.exists()


def made_nothing(database_url: str) -> bool:
    """No SQLite file at the URL, or no table in its PostgreSQL schema."""
    if database_url.startswith("sqlite"):
        return not os.path.exists(database_url.removeprefix("sqlite:///"))
    database = raw(database_url)
    with database.connection_context():
        return database.get_tables() == []


@pytest.mark.servers  # flask commands, each in a process of its own
def test_db_status_tells_an_empty_database_from_an_old_release(database_url):
    if database_url.startswith("sqlite"):
        sqlite3.connect(database_url.removeprefix("sqlite:///")).close()  # a file of 0 bytes
    shown = flask_on(database_url, "db", "status")
    assert shown.returncode == 1, shown.stderr
    assert "empty database: the first start or `flask db upgrade` makes it from schema.sql" in shown.stdout
    build_release(database_url, "1.1")
    old = flask_on(database_url, "db", "status")
    assert old.returncode == 1 and "pending: 0001_baseline" in old.stdout, old.stderr
    assert "empty database" not in old.stdout


@pytest.mark.parametrize("args, listed", [((), "encryption"), (("--help",), "encryption"), (("--app", "wsgi"), "Missing command"),
                                          (("db",), "upgrade"), (("db", "--help"), "upgrade"),
                                          (("db", "status", "--help"), "Schema version"),
                                          (("keys", "create", "--help"), "--org")])
@pytest.mark.servers  # flask commands, each in a process of its own
def test_help_opens_no_database_and_makes_no_key_file(database_url, tmp_path, args, listed):
    """On SQLite without keys, which the service would make; on PostgreSQL with them, or the start
    would be refused before any table is made."""
    key_file = tmp_path / "instance" / "encryption.key"
    shown = flask_on(database_url, *args, key_file=key_file if database_url.startswith("sqlite") else None)
    assert "Usage: flask" in shown.stdout + shown.stderr and listed in shown.stdout + shown.stderr, shown.stderr
    assert "Traceback" not in shown.stderr
    assert made_nothing(database_url) and not key_file.parent.exists()


@pytest.mark.servers  # flask commands, each in a process of its own
def test_schema_commands_other_than_upgrade_read_no_keys(tmp_path):
    """Only `db upgrade` may open a secret (0002 seals a release 1.1 database's): status, backup and
    restore never make the key file."""
    database, copy, key_file = tmp_path / "partner.sqlite3", tmp_path / "copy.sqlite3", tmp_path / "instance" / "key"
    url = f"sqlite:///{database}"
    build_release(url, "1.1")
    status = flask_on(url, "db", "status", key_file=key_file)
    assert status.returncode == 1 and "pending: 0001_baseline" in status.stdout, status.stderr
    assert flask_on(url, "db", "backup", str(copy), key_file=key_file).returncode == 0
    database.unlink()
    restored = flask_on(url, "db", "restore", str(copy), key_file=key_file)
    assert restored.returncode == 0 and database.exists(), restored.stderr
    assert not key_file.parent.exists()


@pytest.mark.servers  # flask commands, each in a process of its own
def test_new_key_needs_neither_encryption_keys_nor_a_database(database_url, tmp_path):
    key_file = tmp_path / "no" / "encryption.key"
    result = flask_on(database_url, "encryption", "new-key", key_file=key_file)
    assert result.returncode == 0, result.stderr
    assert len(base64.urlsafe_b64decode(result.stdout.splitlines()[-1] + "=")) == 32
    assert not key_file.parent.exists()


def assert_no_plaintext_secret(database_url: str) -> None:
    """No webhook secret's bytes in the SQLite file or its -wal (freed pages included); on
    PostgreSQL, none in the subscription table's file (old row versions and a dropped column's
    values included) or in a pg_dump of the schema."""
    if database_url.startswith("sqlite"):
        path = database_url.removeprefix("sqlite:///")
        stored = b"".join(open(p, "rb").read() for p in (path, path + "-wal") if os.path.exists(p))
    else:
        stored = table_file(database_url, "subscription") + pg_dump(database_url)
    assert b"whsec_" not in stored
    assert not any(secret.encode() in stored for secret in SECRETS.values())


def table_file(database_url: str, table: str) -> bytes:
    """A PostgreSQL table's data file as the disk holds it, after a checkpoint has written it out
    (the suite's server runs on this machine, and the tests connect as its superuser)."""
    database = raw(database_url)
    with database.connection_context():
        database.execute_sql("CHECKPOINT")
        [(directory,)] = database.execute_sql("SHOW data_directory").fetchall()
        [(path,)] = run_sql_on(database, "SELECT pg_relation_filepath(:table)", {"table": table}).fetchall()
    return (Path(directory) / path).read_bytes()


def pg_dump(database_url: str) -> bytes:
    """pg_dump of the test's schema (the URL's search_path), as an operator would take it."""
    base, options = database_url.split("?", 1)
    schema = urllib.parse.unquote(options).split("search_path=", 1)[1]
    if shutil.which("pg_dump") is None:
        pytest.skip("pg_dump is not installed")
    return subprocess.run(["pg_dump", "--schema", schema, base.replace("postgresql://", "postgresql://", 1)],
                          capture_output=True, check=True, timeout=60).stdout


# A service starting on the database, killed as its scrub begins: peewee logs each statement just
# before running it, so this is right after the migrations' COMMIT.
KILLED_AT_THE_SCRUB = """
import logging, os, signal, sys
from tests.support import started_app

class KillAtTheScrub(logging.Handler):
    def emit(self, record):
        if record.getMessage().startswith("VACUUM"):
            os.kill(os.getpid(), signal.SIGKILL)

logging.getLogger("peewee").setLevel(logging.DEBUG)
logging.getLogger("peewee").addHandler(KillAtTheScrub())
started_app({"DATABASE_URL": sys.argv[1], "SCHEDULER_ENABLED": False})
"""


def upgraded_until_the_scrub(database_url: str) -> None:
    """Release 1.1's database, migrated by a service that was killed before its scrub ran. Nothing
    else opens the file meanwhile: the last connection to close would checkpoint it, which moves
    its bytes but is no scrub."""
    build_release(database_url, "1.1")
    started = subprocess.run([sys.executable, "-c", KILLED_AT_THE_SCRUB, database_url], cwd=ROOT,
                             capture_output=True, text=True, timeout=60)
    assert started.returncode == -signal.SIGKILL, started.stderr


@pytest.mark.servers  # a service process, killed at the scrub
def test_a_scrub_cut_short_is_done_at_the_next_start(database_url):
    """A kill, a crash or a full disk during the scrub left the secrets' old bytes on disk for
    good: the migrations were committed, so the next start found nothing pending."""
    upgraded_until_the_scrub(database_url)
    open_database(database_url)
    assert_no_plaintext_secret(database_url)


@pytest.mark.servers  # flask commands, each in a process of its own
def test_a_scrub_owed_is_pending_for_db_status_and_done_by_db_upgrade(database_url):
    upgraded_until_the_scrub(database_url)
    pending = flask_on(database_url, "db", "status")
    assert pending.returncode == 1
    assert pending.stdout.splitlines() == [
        f"database schema version {LATEST}, code's latest {LATEST}",
        "scrub owed after 0002_seal_webhook_secrets: `flask db upgrade` (or the next start) runs it"]
    assert flask_on(database_url, "db", "upgrade").returncode == 0
    assert_no_plaintext_secret(database_url)
    assert flask_on(database_url, "db", "status").returncode == 0


def test_a_scrub_that_a_reader_kept_from_emptying_the_wal_stays_owed(brief_busy_timeout, tmp_path):
    """A reader elsewhere (a backup, a service still running) keeps the TRUNCATE checkpoint from
    emptying the -wal, which still holds what the migrations wrote: the scrub is not done."""
    path = str(tmp_path / "partner.sqlite3")
    url = f"sqlite:///{path}"
    build_release(url, "1.1")
    reader = sqlite3.connect(path, isolation_level=None)
    reader.execute("PRAGMA journal_mode = wal")
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM subscription").fetchall()
    with pytest.raises(OperationalError, match="kept the scrub from emptying the -wal"):
        open_database(url)
    reader.close()
    database = raw(url)
    with database.connection_context():
        assert migrations.status(database).scrub_owed == ["0002_seal_webhook_secrets"]
    open_database(url)
    assert_no_plaintext_secret(url)


def test_an_event_queued_before_release_1_4_is_sent_byte_for_byte(database_url):
    build_release(database_url, "1.1")
    open_database(database_url)
    with db.connection_context():
        claims = claim_due(T + 10**9, 10, 60_000)
        [pending] = [row for row in ROWS["event"] if row["id"] == claims[0].event_id]
        assert (claims[0].body, Event.get_by_id(pending["id"]).data) == (pending["body"], '{"message":"café"}'.encode())
