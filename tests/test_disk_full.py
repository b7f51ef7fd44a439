"""A full disk under a serving process, for real: the SQLite database lives on a tmpfs of its own,
filled to the last block. Writes answer 503 and change nothing, reads are served, /readyz says the
database cannot take a write, the scanner logs the outage once and backs off; once space is freed
the same process takes writes and delivers again. And a process started on a full disk says so.

Why a real file system: a full disk lets SQLite begin a transaction (BEGIN IMMEDIATE succeeds) and
fails only the write of the commit to the `-wal` file, with SQLITE_FULL ("database or disk is
full"). Mounting a tmpfs needs CAP_SYS_ADMIN, which this machine and CI have (they run as root);
elsewhere these tests skip, saying so. The WAL is checkpointed and truncated before the disk fills:
SQLite reuses a checkpointed WAL's space without growing the file, so with a large WAL left over a
full disk takes writes until the WAL must grow, and the outage would start at an unknown moment.
"""

import logging
import os
import sqlite3
import subprocess

import pytest

from tests.support import started_app
from partner.errors import StartRefused
from partner.telemetry.logs import database_name
from tests.contract import ContractClient
from tests.receivers import Receiver
from tests.support import (ME, PUBLIC_URL, WEBHOOKS, assert_problem, assert_unavailable, bearer, counting_scans,
                           eventually, json_of)

DISK_BYTES = 4 * 2**20


class SmallDisk:
    """A tmpfs of DISK_BYTES at `path`, that fill() fills to the last block and free() empties again."""

    def __init__(self, path):
        self.path, self.filler = path, path / "filler"

    def fill(self) -> None:
        descriptor = os.open(self.filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        try:
            while True:
                os.write(descriptor, b"\0" * 4096)
        except OSError as error:
            assert error.errno == 28, error  # ENOSPC: the file system is full
        finally:
            os.close(descriptor)

    def free(self) -> None:
        self.filler.unlink()


@pytest.fixture
def disk(tmp_path):
    path = tmp_path / "disk"
    path.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_BYTES}", "tmpfs", str(path)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root / CAP_SYS_ADMIN): {mounted.stderr.strip()}")
    yield SmallDisk(path)
    # Lazily: the app's pooled connections may still hold the database files open.
    subprocess.run(["umount", "--lazy", str(path)], check=True)


@pytest.fixture
def database_url(disk):
    return f"sqlite:///{disk.path}/partner.sqlite3"


def truncate_wal(database_url: str) -> None:
    """Fold the WAL into the database and empty it: the next commit must grow it (see the docstring)."""
    connection = sqlite3.connect(database_url.removeprefix("sqlite:///"))
    try:
        (busy, _, _), = connection.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        assert busy == 0
    finally:
        connection.close()


def logged(caplog, name: str, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == name and r.levelno == level]


@pytest.mark.config(SCHEDULER_ENABLED=True, DELIVERY_POLL_INTERVAL=0.05, WEBHOOK_ALLOWED_NETWORKS=["127.0.0.0/8"])
def test_a_full_disk_is_503_for_writes_reads_served_logged_once_and_the_same_process_recovers(
        app, client, auth, disk, database_url, caplog):
    receiver = Receiver().start()
    dispatcher = app.extensions["delivery"]
    scans = counting_scans(dispatcher)
    try:
        subscription = json_of(client.post(WEBHOOKS, json={"url": receiver.url}, headers=auth), 201)
        acknowledged = json_of(client.post(f"{WEBHOOKS}/{subscription['id']}/test",
                                           json={"secret": subscription["secret"]}, headers=auth), 202)["id"]
        truncate_wal(database_url)
        disk.fill()
        dispatcher.start()  # it finds the acknowledged delivery due, and cannot claim it
        writes = {
            "POST /webhooks": lambda: client.post(WEBHOOKS, json={"url": receiver.url}, headers=auth),
            "POST /test": lambda: client.post(f"{WEBHOOKS}/{subscription['id']}/test",
                                              json={"secret": subscription["secret"]}, headers=auth),
            "DELETE": lambda: client.delete(f"{WEBHOOKS}/{subscription['id']}", headers=auth),
        }
        for write in writes.values():
            assert_unavailable(write())
        assert client.get(ME, headers=auth).status_code == 200
        assert [row["id"] for row in json_of(client.get(WEBHOOKS, headers=auth), 200)["data"]] == \
            [subscription["id"]]  # nothing was changed
        assert json_of(client.get(f"{WEBHOOKS}/{subscription['id']}/failures", headers=auth), 200)["data"] == []
        detail = assert_problem(client.get("/readyz"), 503, "not_ready")["detail"]
        assert detail.startswith("database: the database cannot take a write"), detail
        assert eventually(lambda: len(scans) >= 30)  # 30 polls: 30 failures, had the scanner not backed off
        assert receiver.received == []

        disk.free()
        assert client.post(WEBHOOKS, json={"url": receiver.url}, headers=auth).status_code == 201
        assert receiver.wait_for(1, seconds=10)  # the scanner's next try, after its back-off
        assert receiver.received[0].headers["X-VC-Event-Id"] == acknowledged
        assert client.get("/readyz").status_code == 200
    finally:
        dispatcher.stop()
        receiver.stop()
    [outage] = logged(caplog, "partner.store.availability", logging.ERROR)  # one line for the whole outage, not one per poll
    assert outage.startswith("database unavailable (OperationalError: database or disk is full)"), outage
    [recovery] = logged(caplog, "partner.store.availability", logging.WARNING)
    failures_meanwhile = int(recovery.split("(")[1].split()[0])
    assert failures_meanwhile - len(writes) <= 3, recovery  # the scanner's: 1 s, then 2 s apart


def test_started_on_a_full_disk_it_starts_serves_reads_and_says_so_at_the_first_write(
        config, disk, database_url, api_key, caplog):
    """`api_key` was issued on the first app, which made the database; this is the restart. An
    up-to-date database needs no write to start, so the full disk shows at the first write."""
    truncate_wal(database_url)
    disk.fill()
    with caplog.at_level(logging.INFO):
        app = started_app(config)
    assert logged(caplog, "partner.startup", logging.ERROR) == []
    app.test_client_class = ContractClient
    client = app.test_client()
    assert client.get(ME, headers=bearer(api_key)).status_code == 200
    assert client.get("/healthz").status_code == 200
    assert_unavailable(client.post(WEBHOOKS, json={"url": PUBLIC_URL}, headers=bearer(api_key)))
    [line] = logged(caplog, "partner.store.availability", logging.ERROR)
    assert line.startswith("database unavailable (OperationalError: database or disk is full)"), line
    assert_problem(client.get("/readyz"), 503, "not_ready")
    disk.free()
    assert client.post(WEBHOOKS, json={"url": PUBLIC_URL}, headers=bearer(api_key)).status_code == 201
    assert client.get("/readyz").status_code == 200  # a committed write ended the outage


@pytest.mark.parametrize("url, shown", [
    ("sqlite:////srv/partner/partner.sqlite3", "sqlite:////srv/partner/partner.sqlite3"),
    ("postgresql://partner:s3cr%40t@db.internal:5432/partner", "postgresql://partner@db.internal:5432/partner"),
    ("postgresql://partner@db.internal/partner?password=s3cret&sslmode=require",
     "postgresql://partner@db.internal/partner"),
])
def test_the_start_up_line_names_the_database_without_its_password(url, shown):
    assert database_name(url) == shown


def test_a_database_nobody_holds_open_on_a_full_disk_cannot_be_opened_and_start_up_says_so(
        config, disk, database_url, caplog):
    """The last connection to close removes the -wal and -shm files; a new process must create them
    again, which a full disk refuses (SQLite says "disk I/O error"): not even a read is possible, so
    the process does not start. Start-up names the database and the way out."""
    started_app(config).extensions["database"].close_all()
    assert not (disk.path / "partner.sqlite3-shm").exists()
    disk.fill()
    with pytest.raises(StartRefused):
        started_app(config)
    [line] = logged(caplog, "partner.startup", logging.ERROR)
    assert line == (f"database {database_url} cannot read its schema version (OperationalError: disk I/O error): the service "
                    "cannot start until it can (SQLite: its folder must exist, writable by the service's user, "
                    "with free room for the -wal and -shm files)")
