"""Writers of several processes on one SQLite file take turns on a lock file beside it.

SQLite has one writer. A process that finds it taken sleeps in SQLite's busy handler for 1 to
100 ms between tries, while the process holding it takes it again and again: with two workers,
their delivery threads spent about half of their writing time asleep there (bench/scale_out,
py-spy). Waiting on a POSIX lock instead, a process takes the turn within a millisecond of the
one before its own ending, and turns alternate between busy processes (_take). Start-up takes a
turn too, so that one process at a time opens a new file (switching it to WAL) and applies
migrations while the others wait, for as long as that takes (partner.migrations.upgrade).

POSIX locks belong to a process: a forked worker never shares its parent's, and the threads of one
process must take turns among themselves first (database._writer_turn holds its lock around
turn(); migrations.upgrade takes its turn before the process starts a thread). Anything else
writing to the file (the sqlite3 shell) still meets the busy handler.
"""

import errno
import fcntl
import os
import threading
import time
from contextlib import contextmanager

from peewee import OperationalError

TURN, QUEUE = 0, 1  # the bytes of the lock file that are locked
# How long a write waits for its turn, as long as SQLite's busy_timeout (models.SQLITE_PRAGMAS);
# start-up waits for another process's migrations as long as they take (migrations.upgrade).
# While it waits it tries again every SHORT_PAUSE for SHORT_WAIT, as long as the service's own
# writes take, so that it starts within about that pause of the turn before ending; then every
# LONG_PAUSE, so that a long wait (behind a backup, or migrations at start-up) costs little CPU
# (bench/writer_turns: pauses doubling from 0.1 to 1 ms left the writer unused a fifth of the time).
WAIT_SECONDS, SHORT_WAIT = 5.0, 0.01
SHORT_PAUSE, LONG_PAUSE = 0.0001, 0.001
_depth = threading.local()  # how many turns this thread is inside (they nest)
_open: tuple[int, str, int] | None = None  # (pid, database file, its lock file's descriptor)
# Threads may take their first turns at once (tests run migrations.upgrade on several): they open
# the lock file one at a time.
_opening = threading.Lock()


@contextmanager
def turn(path: str | None, wait: float = WAIT_SECONDS):
    """Hold this process's turn to write to the SQLite file at `path` (nothing to take for an
    in-memory database), waiting for it at most `wait` seconds (math.inf: as long as it takes).
    Re-entrant: only the outermost turn of a thread takes and gives back."""
    depth = getattr(_depth, "value", 0)
    descriptor = _descriptor(path) if depth == 0 else None
    if descriptor is not None:
        _take(descriptor, wait)
    _depth.value = depth + 1
    try:
        yield
    finally:
        _depth.value = depth
        if descriptor is not None:
            fcntl.lockf(descriptor, fcntl.LOCK_UN, 1, TURN)


def _take(descriptor: int, wait: float) -> None:
    """Take the turn (byte TURN) through the queue (byte QUEUE), then leave the queue. A process
    whose turn just ended cannot take the next one at once: it must queue first, behind whoever
    waits for the turn holding the queue. A lock released is not handed to the longest waiter
    (the process that released it, still running, usually wins): without the queue, a busy
    process kept the database and another waited without end. Bounded, as SQLite's busy handler
    is: after `wait` seconds the write fails as "database is locked" (a 503, or the scanner's backoff)."""
    deadline = time.monotonic() + wait
    try:
        _lock(descriptor, QUEUE, deadline)
        try:
            _lock(descriptor, TURN, deadline)
        finally:
            fcntl.lockf(descriptor, fcntl.LOCK_UN, 1, QUEUE)
    except TimeoutError:
        raise OperationalError(f"database is locked: another process held its turn to write for over "
                               f"{wait:g} s") from None


def _lock(descriptor: int, byte: int, deadline: float) -> None:
    """Lock `byte`, trying again after short pauses, then long ones: a blocking lock cannot be
    given up after a while. TimeoutError at `deadline`."""
    short_until = time.monotonic() + SHORT_WAIT
    while True:
        try:
            fcntl.lockf(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, byte)
            return
        except OSError as error:
            if error.errno not in (errno.EACCES, errno.EAGAIN):
                raise OperationalError(f"unable to open the database's writer lock: {error}") from error
        now = time.monotonic()
        pause = SHORT_PAUSE if now < short_until else LONG_PAUSE
        if now + pause > deadline:
            raise TimeoutError
        time.sleep(pause)


def _descriptor(path: str | None) -> int | None:
    if not path or path == ":memory:" or path.startswith("file:"):
        return None
    global _open
    pid, path = os.getpid(), os.path.abspath(path)
    with _opening:
        if _open is None or _open[:2] != (pid, path):
            if _open is not None and _open[0] == pid:
                os.close(_open[2])  # one database per process (models.open_database): the previous one's
            try:
                _open = (pid, path, os.open(path + ".writer", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600))
            except OSError as error:
                raise OperationalError(f"unable to open the database's writer lock: {error}") from error
        return _open[2]
