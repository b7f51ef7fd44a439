"""Start-up: the one explicit step between building the app (which opens nothing) and serving it.

It runs once per service start, in gunicorn's master before workers fork (gunicorn.conf.py
`on_starting`); in each `flask` command, as much of it as the command declares it needs
(partner/operator/commands.py `starts`); and in the tests' app fixture. A worker only loads the keys
(`start_worker`): the master has checked and migrated the database it will serve.

Every refusal comes before the first write. What is checked before writing — the schema's version and
the key ids of stored secrets — is read on SQLite through a read-only connection, which can neither
write nor checkpoint the -wal into the file when it closes: a refused start leaves the database file
and its -wal byte for byte as they were. Nothing here waits on a lock that an operator's `sqlite3`
shell may hold, unless there are migrations to apply; reads go on beside a held write lock.
"""

import logging
import os
from typing import NoReturn
from urllib.parse import quote

import click
from flask import Flask
from peewee import SqliteDatabase

from partner import sealing
from partner.config import separate_budgets
from partner.errors import StartRefused
from partner.private_files import keep_private
from partner.resealing import check_stored_keys
from partner.store import migrations
from partner.store.availability import describe, is_unavailable, open_hint
from partner.store.backup import hold_serving_lock
from partner.store.connection import DatabaseTooOld, make_directory, require_supported, sqlite_file
from partner.store.migrations import SchemaStatus
from partner.telemetry import metrics
from partner.telemetry.logs import database_name

log = logging.getLogger(__name__)

# What a `flask` command needs of the start-up (each declares one: operator/commands.py `starts`).
NOTHING = "nothing"  # neither keys nor a database: `encryption new-key`
AS_IT_IS = "as it is"  # the database as it is, neither migrated nor refused for pending migrations
UP_TO_DATE = "up to date"  # a database with no pending migration: every command that works on the data


def start_service(app: Flask, workers: int = 1) -> None:
    """Everything a service start does before serving, in order: refuse what it cannot serve (a
    database too old or newer than the code, a secret sealed under an unknown key), then migrate
    (which makes the cursor key) and read the cursor key. `workers`: how many processes will serve it."""
    url = app.config["DATABASE_URL"]
    database = app.extensions["database"]
    _check_delivery_settings(app)
    _keep_private(app)
    _require_supported(database, url)
    if sqlite_file(url):
        _hold_the_file(url)
        if workers > 1:  # correct, but no faster
            log.warning("SQLite is served by one process: %d workers share its one writer and deliver no "
                        "more than one; more processes need PostgreSQL (docs/deploying.md)", workers)
    budgets = separate_budgets(app.config["RATELIMIT_STORAGE_URI"], workers)
    if budgets:
        log.warning(budgets)
    _check_before_writing(app, _status(database, url))
    _migrate(database, url)
    with database.connection_context():
        _guard(url, "read its cursor key", app.extensions["cursors"])
    database.close_all()  # no connection crosses the fork into the workers


def start_worker(app: Flask) -> None:
    """What each serving process needs beside the master's start-up: the keys, in memory, its
    delivery transport, and its metrics' known series at zero."""
    _check_delivery_settings(app)
    _load_keys(app)
    metrics.create_known_series()


def _check_delivery_settings(app: Flask) -> None:
    try:
        app.extensions["delivery"].courier.sender  # noqa: B018 - built now, so that a bad CA bundle is refused now
    except ValueError as error:
        refuse(error, "refusing to start: %s", error)


def start_command(app: Flask, needs: str, keys: bool = False) -> None:
    """The start-up a `flask` command declared: `needs` one of NOTHING, AS_IT_IS, UP_TO_DATE; `keys`:
    it opens webhook secrets. Refuses, exit 1 in one line, a missing SQLite file (opening one would
    make an empty database), a database newer than the code and, for UP_TO_DATE, pending migrations."""
    if needs == NOTHING:
        return
    url, database = app.config["DATABASE_URL"], app.extensions["database"]
    _keep_private(app)
    _require_supported(database, url)
    path = sqlite_file(url)
    if path and not os.path.exists(path):
        refuse(FileNotFoundError(path), "no database at %s: a service makes a new one at its first start", path)
    if keys:
        _load_keys(app)
    if needs == UP_TO_DATE:
        status = _status(database, url)
        _refuse_newer(status, url)
        if not status.is_up_to_date:
            refuse(RuntimeError(), "database %s has pending migrations (%s): run `flask db upgrade` first",
                    database_name(url), ", ".join(status.pending + status.scrub_owed))
        if keys:
            _refuse_unknown_keys(database, url)


def _check_before_writing(app: Flask, status: SchemaStatus) -> None:
    url = app.config["DATABASE_URL"]
    _refuse_newer(status, url)
    _load_keys(app)
    if not status.empty:
        _refuse_unknown_keys(app.extensions["database"], url)


def _status(database, url: str) -> SchemaStatus:
    """The schema's status, read without writing; a SQLite file not made yet is an empty database."""
    path = sqlite_file(url)
    if path and not os.path.exists(path):
        return migrations.status_of_nothing()
    reader = _reader(database, url)
    with reader.connection_context():
        return _guard(url, "read its schema version", lambda: migrations.status(reader))


def _reader(database, url: str):
    """The database to read before writing: on SQLite a read-only connection to the file; on
    PostgreSQL the database itself, whose reads change nothing."""
    path = sqlite_file(url)
    return database if path is None else SqliteDatabase(f"file:{quote(path)}?mode=ro", uri=True)


def _refuse_newer(status: SchemaStatus, url: str) -> None:
    if status.is_newer:
        refuse(RuntimeError(), "database %s refused: %s", database_name(url), status.refusal())


def _refuse_unknown_keys(database, url: str) -> None:
    reader = _reader(database, url)
    with reader.connection_context():
        try:
            _guard(url, "read its stored key ids", lambda: check_stored_keys(reader))
        except sealing.SealingError as error:
            refuse(error, "database %s refused: %s", database_name(url), error)


def _migrate(database, url: str) -> None:
    try:
        _guard(url, "be migrated", lambda: migrations.upgrade(database))
    except migrations.SchemaTooNew as error:  # another release migrated it meanwhile
        refuse(error, "database %s refused: %s", database_name(url), error)


def _require_supported(database, url: str) -> None:
    try:
        _guard(url, "be opened", lambda: require_supported(database))
    except DatabaseTooOld as error:
        refuse(error, "database %s refused: %s", database_name(url), error)


def _guard(url: str, doing: str, work):
    """`work()`, refusing in one line when the database cannot answer (down, full, unreadable)."""
    try:
        return work()
    except Exception as error:  # noqa: BLE001 - sorted by is_unavailable, the rest re-raised
        if not is_unavailable(error):
            raise
        refuse(error, "database %s cannot %s (%s): the service cannot start until it can (%s)",
               database_name(url), doing, describe(error), open_hint(url))


def _hold_the_file(url: str) -> None:
    """The SQLite file's directory made if missing, and the file marked as served (`flask db restore`
    refuses while it is); refused in one line where that directory cannot be written."""
    try:
        make_directory(url)
        hold_serving_lock(sqlite_file(url))
    except OSError as error:
        directory = os.path.dirname(os.path.abspath(sqlite_file(url)))
        refuse(error, "refusing to start: cannot write in %s, the database's directory (%s): the service "
               "writes the database, its -wal and -shm there; make it writable by the service's user, or "
               "set PARTNER_DATABASE_URL to a file elsewhere", directory, error.strerror or error)


def _keep_private(app: Flask) -> None:
    """Every file this process makes from now on, and the data files already there, readable by the
    service's user only."""
    keep_private(sqlite_file(app.config["DATABASE_URL"]), _key_file(app), app.instance_path)


def _key_file(app: Flask) -> str:
    return app.config["ENCRYPTION_KEY_FILE"] or os.path.join(app.instance_path, "encryption.key")


def _load_keys(app: Flask) -> None:
    """The keys that seal webhook secrets; a setting that cannot be used is refused in one line."""
    key_file = _key_file(app)
    may_use_file = sqlite_file(app.config["DATABASE_URL"]) is not None
    try:
        sealing.use(sealing.load_keyring(app.config["ENCRYPTION_KEYS"], key_file, may_use_file))
    except sealing.SealingError as error:
        refuse(error, "refusing to start: %s", error)
    except OSError as error:  # the key file cannot be read or made (a read-only instance folder)
        refuse(error, "refusing to start: the key file %s cannot be used (%s): set PARTNER_ENCRYPTION_KEYS, "
                "or let the service write its instance folder", key_file, error.strerror or error)


def refuse(error: Exception, message: str, *args) -> NoReturn:
    """Say in one line why the service cannot start. A `flask` command then exits 1 without a
    traceback (the line says it all); elsewhere StartRefused is raised (gunicorn's master stops)."""
    log.error(message, *args)
    if click.get_current_context(silent=True) is not None:
        raise click.exceptions.Exit(1) from error
    raise StartRefused(message % args) from error

