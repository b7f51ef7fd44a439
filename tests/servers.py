"""Real, throwaway Redis and PostgreSQL servers for the scale-out tests: loopback only, random ports,
a temporary directory each, started once per session and stopped at its end. Never mocks.

When the binaries are missing the tests that need them skip; `scripts/test-services.sh` installs them.
"""

import glob
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import pytest

from tests.support import eventually, free_port

INSTALL_HINT = "run scripts/test-services.sh to install it"
DATABASE = "partner"  # the one database on the test server; each test has a schema in it
START_SECONDS = 30


class Watchdog:
    """Runs a shell command once this test process is gone, however it ends (even SIGKILL): it
    waits for the end of a pipe only we hold. So an interrupted run leaves no server behind."""

    def __init__(self, script: str):
        self.process = subprocess.Popen(["sh", "-c", f"read _; {script}"], stdin=subprocess.PIPE,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                        start_new_session=True)  # outlives a kill of our group

    def cancel(self) -> None:
        """The server was stopped cleanly: nothing left to do."""
        self.process.kill()
        self.process.wait()
        self.process.stdin.close()


def stop_server(process: subprocess.Popen, watchdog: Watchdog | None) -> None:
    """SIGTERM, and SIGKILL if it has not exited within 10 s; its watchdog is then not needed."""
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    if watchdog:
        watchdog.cancel()


def wait_until(ready, process: subprocess.Popen, what: str, log: Path) -> None:
    """Return once `ready()`; raise with the server's log if it exits first or is not ready in time."""
    def ready_or_gone() -> bool:
        return process.poll() is not None or ready()
    if not eventually(ready_or_gone, START_SECONDS, pause=0.05) or process.poll() is not None:
        raise RuntimeError(f"{what} did not start:\n{log.read_text(errors='replace')[-2000:]}")


# --- Redis ----------------------------------------------------------------------------------------

@dataclass
class RedisServer:
    port: int
    process: subprocess.Popen
    watchdog: Watchdog | None = None

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def client(self):
        import redis
        return redis.Redis(host="127.0.0.1", port=self.port)

    def stop(self) -> None:
        stop_server(self.process, self.watchdog)


def start_redis(binary: str, workdir: Path) -> RedisServer:
    log = workdir / "redis.log"
    for _ in range(5):  # another process may take the port between probing and binding
        port = free_port()
        process = subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(workdir), "--logfile", str(log), "--daemonize", "no"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        server = RedisServer(port, process, Watchdog(f"kill {process.pid}"))
        try:
            wait_until(lambda: _redis_answers(server), process, "redis-server", log)
            return server
        except RuntimeError:
            server.stop()
    raise RuntimeError(f"redis-server did not start:\n{log.read_text(errors='replace')[-2000:]}")


def _redis_answers(server: RedisServer) -> bool:
    import redis
    try:
        return bool(server.client().ping())
    except redis.ConnectionError:
        return False


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip(f"redis-server is not installed: {INSTALL_HINT}")
    server = start_redis(binary, tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()


def marked_servers(request) -> None:
    """A test handed a server must be marked `servers` (conftest.py), or `make test-fast` would run
    it and start the server."""
    if request.node.get_closest_marker("servers") is None:
        raise pytest.UsageError(f"{request.node.nodeid} starts a server but is not marked `servers`")


@pytest.fixture
def redis_url(request, redis_server):
    """A Redis URL on an empty database: every test starts with no counted requests."""
    marked_servers(request)
    redis_server.client().flushall()
    return redis_server.url()


# --- PostgreSQL -----------------------------------------------------------------------------------

def postgres_bin_dir() -> Path | None:
    """The newest /usr/lib/postgresql/<version>/bin that has initdb and pg_ctl."""
    found = [Path(p).parent for p in glob.glob("/usr/lib/postgresql/*/bin/initdb")
             if Path(p).with_name("pg_ctl").exists()]
    return max(found, key=lambda d: int(d.parent.name) if d.parent.name.isdigit() else 0, default=None)


@dataclass
class PostgresServer:
    port: int
    root: Path
    bin_dir: Path
    as_user: list
    watchdog: Watchdog | None = None
    options: str = ""  # postgres's command-line options, kept for resume()
    frozen: list = field(default_factory=list)  # the processes freeze() stopped

    def url(self, schema: str) -> str:
        """A PARTNER_DATABASE_URL whose connections see only `schema` (their search_path)."""
        return (f"postgresql://postgres@127.0.0.1:{self.port}/{DATABASE}"
                f"?options={quote(f'-c search_path={schema}')}")

    def connect(self, schema: str):
        """A peewee database seeing only `schema` (not bound to the models)."""
        from peewee import PostgresqlDatabase
        return PostgresqlDatabase(DATABASE, host="127.0.0.1", port=self.port, user="postgres",
                                  options=f"-c search_path={schema}")

    def create_schema(self) -> str:
        """A new, empty schema: as good as a new database for a test, and far quicker to make."""
        name = f"test_{uuid.uuid4().hex[:12]}"
        self.execute(f'CREATE SCHEMA "{name}"')
        return name

    def execute(self, sql: str, database: str = DATABASE) -> None:
        """Run one statement as the superuser, outside a transaction."""
        import psycopg2
        conn = psycopg2.connect(host="127.0.0.1", port=self.port, user="postgres", dbname=database)
        try:
            conn.autocommit = True
            with conn.cursor() as cursor:
                cursor.execute(sql)
        finally:
            conn.close()

    def pg_ctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run([*self.as_user, str(self.bin_dir / "pg_ctl"), "-D", str(self.root / "data"),
                               *args], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              check=check)

    def stop_command(self) -> list[str]:
        return [*self.as_user, str(self.bin_dir / "pg_ctl"), "-D", str(self.root / "data"),
                "stop", "-m", "immediate", "-w"]

    def pause(self) -> None:
        """An outage: stop the server (its connections drop), keeping its data for resume()."""
        self.pg_ctl("stop", "-m", "fast", "-w")

    def resume(self) -> None:
        """Start the paused server again, on the same port with the same data."""
        self.pg_ctl("start", "-w", "-t", str(START_SECONDS), "-l", str(self.root / "postgres.log"),
                    "-o", self.options)

    def freeze(self) -> None:
        """A server alive to the kernel that answers nothing (SIGSTOP on every process of it): its
        sockets still take bytes and acknowledge them. thaw() lets it run on."""
        postmaster = int((self.root / "data" / "postmaster.pid").read_text().split()[0])
        os.kill(postmaster, signal.SIGSTOP)  # first: then it starts no process while the others stop
        self.frozen.append(postmaster)
        # Again until none is left running: a backend forked just before the postmaster stopped may
        # show in /proc only after the first look.
        while running := [pid for pid in children(postmaster) if pid not in self.frozen]:
            for pid in running:
                os.kill(pid, signal.SIGSTOP)
                self.frozen.append(pid)

    def thaw(self) -> None:
        for pid in self.frozen:
            os.kill(pid, signal.SIGCONT)
        self.frozen = []

    def stop(self) -> None:
        self.thaw()
        subprocess.run(self.stop_command(), stdin=subprocess.DEVNULL, capture_output=True)
        shutil.rmtree(self.root, ignore_errors=True)
        if self.watchdog:
            self.watchdog.cancel()


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid`."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except (OSError, ValueError):
            continue
        if entry.isdigit() and int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry))
    return found


def start_postgres(bin_dir: Path) -> PostgresServer:
    # Not under pytest's tmp dir: that is private to root, and postgres refuses to run as root.
    root = Path(tempfile.mkdtemp(prefix="partner-pg-"))
    as_user = []
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
        as_user = ["runuser", "-u", "postgres", "--"]
    server = PostgresServer(0, root, bin_dir, as_user)
    server.watchdog = Watchdog(f"{shlex.join(server.stop_command())}; rm -rf {shlex.quote(str(root))}")
    try:
        initdb = subprocess.run([*as_user, str(bin_dir / "initdb"), "-D", str(root / "data"), "-U", "postgres",
                                 "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync"],
                                stdin=subprocess.DEVNULL, capture_output=True, text=True)
        if initdb.returncode != 0:
            raise RuntimeError(f"initdb failed:\n{initdb.stdout}{initdb.stderr}")
        for _ in range(5):  # another process may take the port between probing and binding
            server.port = free_port()
            # A test server: durability is not needed, speed is.
            server.options = (f"-c listen_addresses=127.0.0.1 -p {server.port} -k {root} "
                              "-c fsync=off -c synchronous_commit=off -c full_page_writes=off")
            started = server.pg_ctl("start", "-w", "-t", str(START_SECONDS), "-l", str(root / "postgres.log"),
                                    "-o", server.options, check=False)
            if started.returncode == 0:
                server.execute(f'CREATE DATABASE "{DATABASE}"', database="postgres")
                return server
        raise RuntimeError("PostgreSQL did not start:\n"
                           + (root / "postgres.log").read_text(errors="replace")[-2000:])
    except BaseException:
        server.stop()
        raise


def postgres_bin_dir_or_skip() -> Path:
    bin_dir = postgres_bin_dir()
    if bin_dir is None:
        pytest.skip(f"PostgreSQL (initdb, pg_ctl under /usr/lib/postgresql/*/bin) is not installed: {INSTALL_HINT}")
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        pytest.skip("PostgreSQL refuses to run as root and runuser is missing")
    return bin_dir


def running_postgres():
    server = start_postgres(postgres_bin_dir_or_skip())
    yield server
    server.stop()


@pytest.fixture(scope="session")
def postgres_server():
    yield from running_postgres()


@pytest.fixture
def own_postgres_server(request):
    """A PostgreSQL server for this test alone, for tests that stop it: the session's is shared."""
    marked_servers(request)
    yield from running_postgres()


@pytest.fixture
def postgres_url(request, postgres_server):
    """A database URL for this test alone: an empty schema of its own. Nothing is dropped
    afterwards: the whole server is thrown away at the end of the session."""
    marked_servers(request)
    return postgres_server.url(postgres_server.create_schema())
