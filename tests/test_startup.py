"""The factory opens nothing; the start-up step refuses before it writes, and never needs a write it
has nothing to make (partner/startup.py)."""

import hashlib
import os
import sqlite3
import subprocess
from pathlib import Path

import pytest
from peewee import PostgresqlDatabase, SqliteDatabase

from app import create_app
from models import db
from partner.keys import create_key
from partner.errors import StartRefused
from partner.startup import start_service
from tests.gunicorn_server import BIN, ROOT, run_flask
from tests.support import NEW_ENCRYPTION_KEY, PUBLIC_URL, WEBHOOKS, bearer, free_port, started_app

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def no_connection(monkeypatch):
    """Every database connect fails, on both drivers: whatever opens one raises."""
    def refuse(*args, **kwargs):
        raise AssertionError("a database connection was opened")
    monkeypatch.setattr(SqliteDatabase, "_connect", refuse)
    monkeypatch.setattr(PostgresqlDatabase, "_connect", refuse)


@pytest.mark.parametrize("url", ["sqlite:///{tmp}/instance/partner.sqlite3", "postgresql://nobody@127.0.0.1:9/none"])
def test_building_the_app_opens_no_file_and_no_connection(no_connection, tmp_path, url):
    app = create_app({"DATABASE_URL": url.format(tmp=tmp_path), "ENCRYPTION_KEY_FILE": str(tmp_path / "key")})
    assert app.url_map.bind("localhost").match("/api/v1/partner/me")
    assert list(tmp_path.iterdir()) == []  # no database file, no directory, no key file


def test_no_product_module_reads_the_command_line():
    readers = [str(path.relative_to(ROOT)) for path in [*ROOT.glob("*.py"), *(ROOT / "partner").rglob("*.py")]
               if "sys.argv" in path.read_text()]
    assert readers == []


def fingerprint(path: Path) -> dict:
    """The database file and its -wal, byte for byte (a -wal that is absent or empty reads the same)."""
    return {suffix: hashlib.sha256(Path(f"{path}{suffix}").read_bytes() if Path(f"{path}{suffix}").exists()
                                   else b"").hexdigest() for suffix in ("", "-wal")}


@pytest.fixture
def database_with_a_wal(tmp_path, config):
    """A served database, a sealed secret in it, whose last writes are still in its -wal (another
    process holds it open)."""
    path = tmp_path / "partner.sqlite3"
    app = started_app(config)
    client = app.test_client()
    with app.app_context(), db.connection_context():
        key = create_key("acme", ["webhooks:manage"], 0).full_key
    assert client.post(WEBHOOKS, json={"url": PUBLIC_URL}, headers=bearer(key)).status_code == 201
    holder = sqlite3.connect(path)
    holder.execute("PRAGMA wal_autocheckpoint = 0")
    holder.execute("SELECT 1 FROM setting").fetchall()
    app.extensions["database"].close_all()
    assert Path(f"{path}-wal").stat().st_size > 0
    yield path
    holder.close()


def test_a_start_refused_for_an_unknown_key_leaves_the_file_and_its_wal_as_they_were(database_with_a_wal, config):
    before = fingerprint(database_with_a_wal)
    with pytest.raises(StartRefused, match="sealed under key id"):
        start_service(create_app({**config, "ENCRYPTION_KEYS": [NEW_ENCRYPTION_KEY]}))
    assert fingerprint(database_with_a_wal) == before


def test_a_start_refused_for_a_newer_schema_leaves_the_file_and_its_wal_as_they_were(database_with_a_wal, config):
    writer = sqlite3.connect(database_with_a_wal)
    writer.execute("PRAGMA wal_autocheckpoint = 0")
    with writer:
        writer.execute("INSERT INTO schema_migration (name, applied) VALUES ('9999_from_the_future', '2030-01-01')")
    writer.close()
    before = fingerprint(database_with_a_wal)
    with pytest.raises(StartRefused, match="newer than this code"):
        start_service(create_app(config))
    assert fingerprint(database_with_a_wal) == before


def test_an_up_to_date_start_beside_a_held_write_lock_writes_nothing_and_waits_for_nothing(app, config, tmp_path):
    """An operator's sqlite3 shell holds the write lock: the next start has nothing to write."""
    app.extensions["database"].close_all()
    shell = sqlite3.connect(tmp_path / "partner.sqlite3", isolation_level=None)
    shell.execute("BEGIN IMMEDIATE")
    try:
        restarted = started_app(config)
        with restarted.app_context():
            assert restarted.test_client().get("/healthz").status_code == 200
    finally:
        shell.execute("ROLLBACK")
        shell.close()


def release_1_0_database(path: Path) -> None:
    connection = sqlite3.connect(path)
    connection.executescript((ROOT / "tests/fixtures/schema-1.0.sql").read_text())
    connection.close()


def test_an_operator_command_refuses_pending_migrations_and_changes_nothing(server_env, tmp_path):
    path = tmp_path / "partner.sqlite3"
    release_1_0_database(path)
    before = path.read_bytes()
    result = run_flask(server_env, "keys", "list")
    assert result.returncode == 1
    assert result.stdout == ""
    [line] = result.stderr.strip().splitlines()
    assert "pending migrations" in line and "`flask db upgrade`" in line
    assert path.read_bytes() == before
    status = run_flask(server_env, "db", "status")
    assert status.returncode == 1
    assert "pending: 0001_baseline" in status.stdout


def test_commands_that_open_no_secret_need_no_encryption_key(server_env, tmp_path):
    started_app({"DATABASE_URL": server_env["PARTNER_DATABASE_URL"]}).extensions["database"].close_all()
    env = {name: value for name, value in server_env.items() if name != "PARTNER_ENCRYPTION_KEYS"}
    env["PARTNER_ENCRYPTION_KEY_FILE"] = str(tmp_path / "no-such-dir" / "encryption.key")
    created = run_flask(env, "keys", "create", "--org", "acme")
    assert created.returncode == 0, created.stderr
    assert created.stdout.strip().startswith("vck_")
    assert not (tmp_path / "no-such-dir").exists()


def test_a_key_file_that_cannot_be_made_is_refused_in_one_line(config, tmp_path):
    (tmp_path / "a-file").write_text("")  # where the key's folder would go: root may write anywhere else
    settings = {**config, "ENCRYPTION_KEYS": None, "ENCRYPTION_KEY_FILE": str(tmp_path / "a-file/key")}
    with pytest.raises(StartRefused, match="the key file .* cannot be used"):
        start_service(create_app(settings))


@pytest.mark.servers  # a real gunicorn
def test_a_start_on_a_read_only_database_directory_is_refused_in_one_line(tmp_path):
    """A directory the service cannot write (a read-only mount here; a wrong owner in production): one
    line naming it, exit 4 (the unit then does not restart), no traceback."""
    directory = tmp_path / "data"
    directory.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(directory)], capture_output=True,
                             text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root / CAP_SYS_ADMIN): {mounted.stderr.strip()}")
    try:
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("PARTNER_")},
               "PARTNER_DATABASE_URL": f"sqlite:///{directory}/partner.sqlite3", "PORT": str(free_port()),
               "PARTNER_ENCRYPTION_KEY_FILE": str(tmp_path / "encryption.key")}
        subprocess.run(["mount", "-o", "remount,ro", str(directory)], check=True)
        started = subprocess.run([str(BIN / "gunicorn"), "--no-control-socket", "wsgi:app"], cwd=ROOT, env=env,
                                 capture_output=True, text=True, timeout=60)
    finally:
        subprocess.run(["umount", "--lazy", str(directory)], check=True)
    assert started.returncode == 4, started.stderr
    refusals = [line for line in started.stderr.splitlines() if "refusing to start" in line]
    assert len(refusals) == 1 and f"cannot write in {directory}, the database's directory" in refusals[0]
    assert "Traceback" not in started.stderr


def test_a_refusal_for_an_unknown_key_names_the_key_file_the_keys_came_from(database_with_a_wal, config, tmp_path):
    key_file = tmp_path / "another.key"
    key_file.write_text(NEW_ENCRYPTION_KEY + "\n")
    with pytest.raises(StartRefused, match=f"which the key file {key_file} does not hold"):
        start_service(create_app({**config, "ENCRYPTION_KEYS": None, "ENCRYPTION_KEY_FILE": str(key_file)}))


@pytest.mark.parametrize("app_option", [(), ("--app", "app", "--debug")])  # wsgi.py's app, or the factory with its reloader
def test_flask_run_is_refused_in_one_line_pointing_to_make_run(server_env, app_option):
    """`flask run` would serve without the start-up step (gunicorn.conf.py's hooks): no migration,
    no keys in the worker, no delivery scanner."""
    result = run_flask(server_env, *app_option, "run", "--port", str(free_port()), timeout=20)
    assert (result.returncode, result.stderr.count("\n")) == (1, 1), result.stderr
    assert "`make run`" in result.stderr and "Traceback" not in result.stderr
