"""Reads that every request repeats, answered from memory until the database next changes.

SQLite tells whether anything has been committed since a connection last asked: `PRAGMA
data_version` changes after every commit by any other connection, in any process (a revocation
from the CLI, another worker, the sqlite3 shell). A connection of this process's own, which never
writes, asks it before each read; a value is kept only while the answer stays the same. So a
revocation takes effect on the very next request, everywhere.

That connection is driven through SQLite's C interface with the interpreter lock held. Python's
sqlite3 module lets go of the lock at every step of a statement, and with gunicorn's 8 request
threads each let-go hands it to another thread: that hand-off, not the SQL, was the larger part of
a GET /me (bench/api_overhead.py). Asking costs about 3 µs. It has no busy timeout, so a database
locked by a writer (or being recovered by another connection) answers "busy" at once and the read
goes to the database; only SQLite's own short retries, when a read races a checkpoint, can make it
wait with the lock held.

Nothing is kept where SQLite cannot be asked (PostgreSQL, an in-memory database), nor in a process
forked from the one that opened the database: SQLite's file locks do not survive a fork.
"""

import _sqlite3
import ctypes
import logging
import os
import threading
from dataclasses import dataclass, field
from typing import Callable, Hashable, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

# What one database state may keep, in rows: a key is one, a page of subscriptions one per row.
# None (nothing found) is never kept: made-up keys must not fill memory.
MAX_ROWS = 4096

SQLITE_OK, SQLITE_ROW = 0, 100
SQLITE_OPEN_READWRITE = 0x2  # and not CREATE: the database must already exist
SQLITE_FCNTL_HAS_MOVED = 20


def _sqlite_library():
    """SQLite's C interface, from the very library Python's sqlite3 module runs on: a second copy of
    SQLite in one process would release the other's file locks (sqlite.org/howtocorrupt.html,
    section 2.2.1). PyDLL keeps the interpreter lock for the length of each call."""
    library = ctypes.PyDLL(_sqlite3.__file__)  # its symbols resolve through its libsqlite3
    handle, text, pointer_to = ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)
    for name, argtypes, restype in (
            ("sqlite3_open_v2", [text, pointer_to, ctypes.c_int, text], ctypes.c_int),
            ("sqlite3_prepare_v2", [handle, text, ctypes.c_int, pointer_to, handle], ctypes.c_int),
            ("sqlite3_step", [handle], ctypes.c_int),
            ("sqlite3_column_int64", [handle, ctypes.c_int], ctypes.c_int64),
            ("sqlite3_reset", [handle], ctypes.c_int),
            ("sqlite3_file_control", [handle, text, ctypes.c_int, ctypes.POINTER(ctypes.c_int)], ctypes.c_int),
            ("sqlite3_finalize", [handle], ctypes.c_int),
            ("sqlite3_close_v2", [handle], ctypes.c_int),
            ("sqlite3_errstr", [ctypes.c_int], text)):
        function = getattr(library, name)
        function.argtypes, function.restype = argtypes, restype
    return library


class CommitWatch:
    """`PRAGMA data_version` of one SQLite database, on a connection of its own."""

    def __init__(self, path: str):
        self._sqlite = _sqlite_library()
        self._connection, self._statement = ctypes.c_void_p(), ctypes.c_void_p()
        self._lock = threading.Lock()  # one statement: one thread at a time steps it
        self.moved = False
        opened = self._sqlite.sqlite3_open_v2(os.fsencode(path), ctypes.byref(self._connection),
                                              SQLITE_OPEN_READWRITE, None)
        if opened == SQLITE_OK:
            opened = self._sqlite.sqlite3_prepare_v2(self._connection, b"PRAGMA data_version", -1,
                                                     ctypes.byref(self._statement), None)
        if opened != SQLITE_OK:
            self.close()
            raise OSError(f"SQLite: {self._sqlite.sqlite3_errstr(opened).decode()}")

    def state(self) -> int | None:
        """A number that differs after every commit by another connection; None when SQLite cannot
        answer at once, or when the file was replaced (`moved`: this connection would never see
        a commit to the new one)."""
        with self._lock:
            if self._has_moved():
                self.moved = True
                return None
            try:
                if self._sqlite.sqlite3_step(self._statement) != SQLITE_ROW:
                    return None
                return self._sqlite.sqlite3_column_int64(self._statement, 0)
            finally:
                self._sqlite.sqlite3_reset(self._statement)  # ends the read transaction

    def _has_moved(self) -> bool:
        moved = ctypes.c_int(0)
        asked = self._sqlite.sqlite3_file_control(self._connection, b"main", SQLITE_FCNTL_HAS_MOVED,
                                                  ctypes.byref(moved))
        return asked != SQLITE_OK or bool(moved.value)

    def close(self) -> None:
        self._sqlite.sqlite3_finalize(self._statement)
        self._sqlite.sqlite3_close_v2(self._connection)


@dataclass
class _Generation:
    """The values read while the database was in one state (None: no state seen yet)."""
    state: int | None = None
    values: dict = field(default_factory=dict)
    rows: int = 0


class ReadCache:
    """Values read from one SQLite database, each kept until the next commit to it."""

    def __init__(self, sqlite_path: str | None):
        self._path = sqlite_path
        self._pid = os.getpid()  # the process that opened the database
        self._watch: CommitWatch | None = None
        self._opening = threading.Lock()
        self._generation = _Generation()

    def get(self, key: Hashable, read: Callable[[], T], rows: int = 1) -> T:
        """read(), or the value it returned since the last commit to the database. `rows`: the
        value's size, counted against MAX_ROWS."""
        watch = self._current_watch()
        state = watch.state() if watch else None  # before the read: a later commit is a new state
        if state is None:
            return read()
        generation = self._generation
        if generation.state == state and key in generation.values:
            return generation.values[key]
        value = read()
        if generation.state != state:
            generation = self._generation = _Generation(state)
        if value is not None and generation.rows + rows <= MAX_ROWS:
            generation.values[key] = value
            generation.rows += rows
        return value

    def _current_watch(self) -> CommitWatch | None:
        if self._path is None or self._pid != os.getpid():
            return None
        watch = self._watch
        if watch is None or watch.moved:
            with self._opening:
                if self._watch is watch:
                    # A replaced watch is left open: closing its descriptors would release the
                    # locks this process's other connections hold on that file (POSIX locks are
                    # per process), and a replaced file is a rare operator's act.
                    self._watch = self._open_watch()
                    self._generation = _Generation()
                watch = self._watch
        return watch

    def _open_watch(self) -> CommitWatch | None:
        try:
            return CommitWatch(self._path)
        except Exception as error:  # noqa: BLE001 - any failure only means nothing is kept
            log.warning("reads of %s are not cached: %s", self._path, error)
            self._path = None
            return None
