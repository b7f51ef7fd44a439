"""backup_stall: how long `flask db backup` takes on a database holding HISTORY finished events, each
with a failure record (state_scale's database), and the longest an API write waits meanwhile.

A writer thread commits what a test ping commits (events.enqueue_test_ping, as the API does) one
after another while partner.backup.backup copies the database; each write's duration is recorded.
Target (issue 18): no write stalls more than 100 ms. Standalone: `python bench/backup_stall.py
[HISTORY]`; not yet part of run_all.py.
"""

import os
import statistics
import sys
import tempfile
import threading
import time

import state_scale  # builds the database; sets up the service's keys and path

from models import Subscription, db  # noqa: E402
from tests.support import open_database  # noqa: E402
from partner.store import backup  # noqa: E402
from state_scale import events  # noqa: E402  (the outbox, in trees before events.py)

HISTORY = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000


def main() -> None:
    directory = tempfile.mkdtemp(prefix="backup-stall-", dir="/var/tmp")
    path = os.path.join(directory, "partner.sqlite3")
    started = time.monotonic()
    state_scale.build(path, HISTORY)
    print(f"built {HISTORY} finished events in {time.monotonic() - started:.0f} s: "
          f"{os.path.getsize(path) / 1e6:.0f} MB")
    url = f"sqlite:///{path}"
    open_database(url)
    with db.connection_context():
        subscription = Subscription.select().first()
    writes, done = [], threading.Event()

    def write():
        with db.connection_context():
            while not done.is_set():
                began = time.monotonic()
                events.enqueue_test_ping(subscription, "bench", state_scale.NOW_MS)
                writes.append((began, time.monotonic() - began))

    writer = threading.Thread(target=write)
    writer.start()
    time.sleep(1)
    began = time.monotonic()
    made = backup.backup(url, os.path.join(directory, "backup.sqlite3"))
    took = time.monotonic() - began
    time.sleep(0.5)
    done.set()
    writer.join()
    during = [seconds * 1000 for at, seconds in writes if began <= at <= began + took]
    before = [seconds * 1000 for at, seconds in writes if at < began]
    print(f"backup: {made.bytes / 1e6:.0f} MB in {took:.1f} s, integrity ok")
    slow = sorted(((seconds * 1000, at - began) for at, seconds in writes if seconds > 0.05), reverse=True)[:5]
    print("slowest writes (ms, began at s into the backup):", [(round(ms), round(t, 2)) for ms, t in slow])
    print(f"API writes during the backup: {len(during)}, p50 {statistics.median(during):.1f} ms, "
          f"longest {max(during):.1f} ms (before it: p50 {statistics.median(before):.1f} ms, "
          f"longest {max(before):.1f} ms)")


if __name__ == "__main__":
    main()
