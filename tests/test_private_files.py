"""private_files: the database, its -wal and -shm, backups, the key file and instance/ are readable by
the service's user only, whatever umask the process was started with."""

import os
import sqlite3
import stat

import pytest

from tests.support import started_app
from partner.store.backup import backup, restore
from tests.support import WEBHOOKS, bearer, json_of

pytestmark = pytest.mark.config(ENCRYPTION_KEYS=None)  # the key file is made in instance/ too
DATA_FILES = ("partner.sqlite3", "partner.sqlite3-wal", "partner.sqlite3-shm", "encryption.key")


@pytest.fixture(autouse=True)
def ordinary_umask():
    """The umask most shells and service managers start a process with: files 0644, folders 0755."""
    before = os.umask(0o022)
    yield
    os.umask(before)


@pytest.fixture
def instance(tmp_path):
    return tmp_path / "instance"


@pytest.fixture
def start(config, instance):
    """A service start on instance/partner.sqlite3, with its key file beside it; its test client."""
    settings = {**config, "DATABASE_URL": f"sqlite:///{instance}/partner.sqlite3",
                "ENCRYPTION_KEY_FILE": str(instance / "encryption.key")}
    return lambda: started_app(settings).test_client()


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def readable_by_others(*paths) -> dict:
    return {str(path): oct(mode(path)) for path in paths if mode(path) & 0o077}


def write_something(client, issue_key) -> None:
    """A subscription created through the API: the database gets its -wal and -shm."""
    json_of(client.post(WEBHOOKS, json={"url": "https://hooks.partner.example/h"}, headers=bearer(issue_key())), 201)


def test_after_a_start_and_a_backup_no_data_file_is_readable_by_group_or_other(start, instance, issue_key, tmp_path):
    client = start()
    write_something(client, issue_key)
    os.umask(0o022)  # `flask db backup` in a process of its own
    made = backup(f"sqlite:///{instance}/partner.sqlite3", str(tmp_path / "backup.sqlite3"))
    files = sorted(instance.iterdir())
    assert {path.name for path in files} >= set(DATA_FILES)
    assert readable_by_others(instance, *files, made.path) == {}


def test_files_an_earlier_release_left_readable_are_tightened_at_the_next_start(start, instance, issue_key):
    write_something(start(), issue_key)
    # Held open, as another process would: the -wal and -shm go when the last connection closes,
    # which a pooled connection collected between the two starts would otherwise be.
    reader = sqlite3.connect(instance / "partner.sqlite3")
    reader.execute("SELECT count(*) FROM subscription").fetchone()
    files = [instance / name for name in DATA_FILES]
    for path in files:
        os.chmod(path, 0o644)
    start()
    assert readable_by_others(*files) == {}
    reader.close()


def test_a_restored_database_is_readable_by_its_user_only_whatever_the_copy_was(start, instance, tmp_path, issue_key):
    write_something(start(), issue_key)
    copy = backup(f"sqlite:///{instance}/partner.sqlite3", str(tmp_path / "backup.sqlite3")).path
    os.chmod(copy, 0o644)
    os.umask(0o022)
    target = tmp_path / "restored" / "partner.sqlite3"
    target.parent.mkdir()
    target.write_bytes(b"")  # the database it replaces, world-readable, is moved aside
    os.chmod(target, 0o644)
    moved = restore(f"sqlite:///{target}", copy).moved_aside
    assert readable_by_others(target, *moved) == {}
