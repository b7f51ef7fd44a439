"""Online backup and verified restore of the SQLite database (docs/data.md). PostgreSQL has its own
tools (pg_dump / pg_restore): these refuse it rather than reimplement them.

Backup: SQLite's backup API (sqlite3.Connection.backup) copies every page in one step, inside one
read transaction of the source: in WAL mode a reader never blocks the writers, so the service keeps
accepting and delivering, and the copy is the database as of one commit. (A multi-step backup
restarts whenever another connection writes, so under steady writes it may never finish.) The copy
goes to a temporary name beside PATH, leaves WAL mode (one self-contained file), passes
`integrity_check`, is fsynced, and only then takes its name: a crash leaves no half-written PATH.

Restore: refused while any process serves the database; attempts that were in flight in the copy
are made due again at once. Every process that opens it to serve holds
a shared flock on `<file>.lock` (hold_serving_lock); restore takes it exclusively, without waiting."""

import fcntl
import os
import secrets
import sqlite3
import time
import urllib.parse
from dataclasses import dataclass
from datetime import datetime, timezone

from partner.store import migrations
from partner.store.connection import sqlite_file
from partner.errors import OperatorError
from partner.private_files import keep_private

POSTGRESQL_REFUSAL = ("the database is PostgreSQL: back it up with pg_dump -Fc and restore it with "
                      "pg_restore (docs/data.md)")

_held: dict[str, int] = {}  # the database file -> descriptor of its lock file, while it is in use


@dataclass(frozen=True)
class Copy:
    path: str
    bytes: int
    version: int


def file_uri(path: str, mode: str) -> str:
    """SQLite's URI for the file at `path`, opened in `mode` ("ro", "rw"). Quoted: in a URI, `?`
    and `#` end the path and `%` escapes, so "future#2.sqlite3" would otherwise open "future"."""
    return f"file:{urllib.parse.quote(os.path.abspath(path))}?mode={mode}"


def sqlite_path(url: str) -> str:
    """The database file of a sqlite:/// URL; OperatorError for PostgreSQL or a database in memory."""
    path = sqlite_file(url)
    if path is None:
        raise OperatorError("the database is in memory: it has no file to back up or restore"
                            if url.startswith("sqlite") else POSTGRESQL_REFUSAL)
    return path


def hold_serving_lock(path: str) -> None:
    """Mark the database file as in use by this process until it exits (restore refuses meanwhile).
    Waits while a restore is replacing the file."""
    path = os.path.abspath(path)
    if path not in _held:
        for other in list(_held):  # one database per process (store.connection.bind)
            os.close(_held.pop(other))
        descriptor = os.open(path + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(descriptor, fcntl.LOCK_SH)
        _held[path] = descriptor


def backup(url: str, target: str) -> Copy:
    """Copy the database to `target`, a new file readable by this user only."""
    keep_private()
    source_path, target = sqlite_path(url), os.path.abspath(target)
    if os.path.exists(target):
        raise OperatorError(f"{target} exists: a backup never overwrites a file")
    directory = os.path.dirname(target)
    if not os.path.isdir(directory):  # SQLite would say only "unable to open database file"
        why = "is not a directory" if os.path.exists(directory) else "does not exist"
        raise OperatorError(f"the backup to {target} failed: {directory} {why}")
    partial = f"{target}.partial-{secrets.token_hex(4)}"
    try:
        _copy(source_path, partial)
        version = _verified_version(partial)
        _write_back(partial)
        _fsync(partial)
        os.link(partial, target)  # atomic, and refuses a PATH created meanwhile
        _fsync(directory)
    except (OSError, sqlite3.Error) as error:  # no write permission, a full disk
        raise OperatorError(f"the backup to {target} failed: {error}") from None
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return Copy(target, os.path.getsize(target), version)


def _copy(source_path: str, partial: str) -> None:
    if not os.path.isfile(source_path):
        raise OperatorError(f"no database at {source_path}")
    source = sqlite3.connect(source_path)  # read-write: a read-only one cannot join a WAL database
    copy = sqlite3.connect(partial)
    # No fsync of the copy's own: a flush of the whole copy at once holds up the service's WAL
    # fsyncs behind it; _write_back paces it instead (figures: docs/performance.md, "Backup while serving").
    copy.execute("PRAGMA synchronous=OFF")
    try:
        source.backup(copy)  # pages=-1: one step, one read transaction
        copy.execute("PRAGMA journal_mode=DELETE")  # one self-contained file
    finally:
        copy.close()
        source.close()


def _verified_version(path: str) -> int:
    """The schema version of the database file at `path`, after a full integrity check."""
    if not os.path.isfile(path):
        raise OperatorError(f"{path} is not a file")
    try:
        connection = sqlite3.connect(file_uri(path, "ro"), uri=True)
        try:
            [(verdict,)] = connection.execute("PRAGMA integrity_check(1)").fetchall()
            versioned = connection.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = :table",
                                           {"table": migrations.HISTORY_TABLE}).fetchall()
            # No history: a database made by release 1.0 or 1.1, version 0.
            names = connection.execute(f'SELECT name FROM "{migrations.HISTORY_TABLE}"').fetchall() if versioned else []
        finally:
            connection.close()
    except sqlite3.DatabaseError as error:
        raise OperatorError(f"{path} is not a usable database of this service ({error})") from None
    if verdict != "ok":
        raise OperatorError(f"{path} fails integrity_check: {verdict}")
    return max((migrations.number(name) for (name,) in names), default=0)


def _fsync(path: str) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


_FLUSH_STEP = 1 << 20


def _write_back(path: str) -> None:
    """Start writing the copy's pages to disk 1 MB at a time before its fsync, so the service's own
    commits (each an fsync of the -wal) do not wait behind one flush of the whole copy (the figures:
    docs/performance.md, "Backup while serving").
    POSIX_FADV_DONTNEED makes Linux start the write-back of a range (and drop it from the page
    cache, which the copy does not need); the standard library has no sync_file_range, and no
    ctypes goes into the product for it."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        for offset in range(0, os.fstat(descriptor).st_size, _FLUSH_STEP):
            os.posix_fadvise(descriptor, offset, _FLUSH_STEP, os.POSIX_FADV_DONTNEED)
            time.sleep(0.003)
    finally:
        os.close(descriptor)


@dataclass(frozen=True)
class Restored:
    version: int
    moved_aside: list[str]


def restore(url: str, source: str) -> Restored:
    """Put the verified copy at `source` in place of the database, moving the current file and its
    -wal/-shm aside; refused while any process serves the database. The file put in place, and
    those moved aside, are readable by this user only, whatever their mode was."""
    database_path, source = sqlite_path(url), os.path.abspath(source)
    keep_private(database_path)
    version, latest = _verified_version(source), migrations.number(migrations.names()[-1])
    if version > latest:
        raise OperatorError(f"{source} has schema version {version}, newer than this code's {latest}")
    descriptor = os.open(database_path + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise OperatorError(f"{database_path} is open in a running service: stop every service "
                                f"process first") from None
        return Restored(version, _replace(database_path, source))
    finally:
        os.close(descriptor)  # releases the lock


def _release_leases(path: str) -> None:
    """Attempts in flight when the backup was taken belong to no process now (every service is
    stopped): due again at once, under the same event id, instead of after their leases expire."""
    connection = sqlite3.connect(path)
    try:
        with connection:
            connection.execute("UPDATE delivery SET state = 'pending', lease_token = NULL, due_at = :now_ms "
                               "WHERE state = 'in_flight'", {"now_ms": int(time.time() * 1000)})
    finally:
        connection.close()


def _replace(database_path: str, source: str) -> list[str]:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    incoming = f"{database_path}.restoring-{secrets.token_hex(4)}"
    with open(source, "rb") as copy, open(incoming, "wb") as out:
        while chunk := copy.read(1 << 20):
            out.write(chunk)
    _release_leases(incoming)
    _fsync(incoming)
    moved = []
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(database_path + suffix):
            aside = f"{database_path}.before-restore-{stamp}{suffix}"
            os.rename(database_path + suffix, aside)
            moved.append(aside)
    os.rename(incoming, database_path)
    _fsync(os.path.dirname(database_path))
    return moved
