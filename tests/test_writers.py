"""Writers of several processes take turns on a lock file beside the SQLite database (writers.py):
a write waits for another process's turn and is woken when it ends, a nested write transaction
keeps the turn until the outermost ends, and start-up waits its turn to open and migrate."""

import subprocess
import sys
import time

from models import db, open_database
from partner import writers
from partner.database import run_sql, select_rows, write_transaction
from tests.test_group_commit import SAVE

HOLD_THE_WRITER_LOCK = """
import fcntl, os, sys, time
descriptor = os.open(sys.argv[1] + ".writer", os.O_RDWR | os.O_CREAT, 0o600)
fcntl.lockf(descriptor, fcntl.LOCK_EX, 1)
print("held", flush=True)
time.sleep(float(sys.argv[2]))
"""


def waited_behind_another_process(path: str, act, seconds: float = 0.6) -> float:
    """Seconds that `act()` took while another process held its turn to write to `path` for `seconds`."""
    holder = subprocess.Popen([sys.executable, "-c", HOLD_THE_WRITER_LOCK, path, str(seconds)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        started = time.monotonic()
        act()
        return time.monotonic() - started
    finally:
        holder.wait(timeout=seconds + 10)


def test_a_writer_waits_its_turn_behind_another_process_holding_the_writer_lock(database):
    """Another process's turn to write (the lock file) holds this one's write until it ends: the
    process is woken when the lock is released, not on SQLite's busy handler's next try."""
    def write():
        with write_transaction():
            run_sql(SAVE, ("after the other process",))
    assert waited_behind_another_process(db.database, write) >= 0.4
    assert select_rows("SELECT value FROM setting WHERE name = 'after the other process'", ()) == [
        {"value": "saved"}]


TRY_THE_WRITER_LOCK = """
import fcntl, os, sys
descriptor = os.open(sys.argv[1] + ".writer", os.O_RDWR | os.O_CREAT, 0o600)
try:
    fcntl.lockf(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB, 1)
    print("free")
except OSError:
    print("held")
"""


def writer_lock_seen_from_another_process() -> str:
    return subprocess.run([sys.executable, "-c", TRY_THE_WRITER_LOCK, db.database], capture_output=True,
                          text=True, timeout=30, check=True).stdout.strip()


def test_the_writer_lock_is_held_until_the_outermost_write_transaction_ends(database):
    with write_transaction():
        with write_transaction(durable=False):
            run_sql(SAVE, ("inner",))
        assert writer_lock_seen_from_another_process() == "held"  # the inner one's end kept it
        run_sql(SAVE, ("outer",))
    assert writer_lock_seen_from_another_process() == "free"


def test_start_up_waits_its_turn_to_open_and_migrate_a_new_database(tmp_path):
    """Two workers starting on a new file: the second switched it to WAL while the first was doing
    the same, got "database is locked" at once, and gunicorn stopped both (worker boot error)."""
    path = str(tmp_path / "new.sqlite3")
    opened = []
    assert waited_behind_another_process(path, lambda: opened.append(open_database(f"sqlite:///{path}"))) >= 0.4
    [database] = opened
    with database.connection_context():
        assert database.execute_sql("PRAGMA journal_mode").fetchone()[0] == "wal"
    database.close()


def test_start_up_waits_for_another_process_migrating_for_longer_than_a_write_may_wait(tmp_path):
    """Migrations and the scrub after them take as long as the file is large. A second gunicorn
    worker that gave up after WAIT_SECONDS failed to boot, and gunicorn stopped the one migrating."""
    path = str(tmp_path / "partner.sqlite3")
    migrating = writers.WAIT_SECONDS + 1
    waited = waited_behind_another_process(path, lambda: open_database(f"sqlite:///{path}").close(), migrating)
    assert waited >= migrating - 0.3
