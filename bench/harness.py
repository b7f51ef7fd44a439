"""What every bench shares: the service as `make run` starts it, the fast receiver, the API calls
that set up a workload, percentiles, and the report (a printed table and a JSON file).

Everything runs on 127.0.0.1. Every process started here is stopped by the context manager that
started it, also when the bench fails.
"""

import json
import math
import os
import platform
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

import requests

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
# The tree whose service is measured. Defaults to this repo; point it at a patched copy to
# measure a candidate fix with the same benches (the copy's own .venv is not needed).
SERVICE_ROOT = Path(os.environ.get("BENCH_SERVICE_ROOT") or REPO).resolve()
BIN = Path(sys.executable).parent  # benches run with .venv/bin/python: gunicorn and flask live beside it
QUICK = os.environ.get("BENCH_QUICK") == "1"
# Extra environment for every service the benches start, as JSON, to measure a configuration:
# BENCH_SERVICE_ENV='{"PARTNER_DELIVERY_CONCURRENCY": "32"}'. Recorded in each result.
SERVICE_ENV = json.loads(os.environ.get("BENCH_SERVICE_ENV") or "{}")
RESULTS_DIR = Path(os.environ.get("BENCH_RESULTS_DIR") or BENCH_DIR / "results")
LOOPBACK = "127.0.0.1"
API = "/api/v1/partner"
BOOT_SECONDS = 20
STOP_SECONDS = 15
BIG_RATE_LIMIT = 1_000_000  # the most a key may be given (keys.MAX_RATE_LIMIT): the budget would otherwise throttle the load


def _exit_on_sigterm(signum, _frame):
    # SIGTERM (run_all stopping a bench, a CI timeout) unwinds like an exception, so every
    # try/finally and context manager stops the servers and receivers it started.
    raise SystemExit(128 + signum)


signal.signal(signal.SIGTERM, _exit_on_sigterm)


def pick(full, quick):
    """The full-mode value, or the quick one under BENCH_QUICK=1."""
    return quick if QUICK else full


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        return sock.getsockname()[1]


def http_session() -> requests.Session:
    session = requests.Session()
    session.trust_env = False  # no proxy variables: loopback only
    return session


# --- the service ----------------------------------------------------------------------------------

class Service:
    """One gunicorn as `make run` starts it (`gunicorn wsgi:app` from the repo root, gunicorn.conf.py
    picked up), on a free port, with its own SQLite file in `workdir`."""

    def __init__(self, workdir: Path, env: dict | None = None, app: str = "wsgi:app",
                 name: str = "service", database: Path | None = None, launcher: tuple[str, ...] = (),
                 root: Path | None = None):
        self.workdir = Path(workdir)
        self.launcher = launcher  # a command gunicorn runs under, e.g. prlimit's
        self.root = root or SERVICE_ROOT  # the tree served: another to compare two side by side
        self.name = name
        self.app = app
        self.port = free_port()
        self.database = database or self.workdir / "bench.sqlite3"
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("PARTNER_", "GUNICORN_", "FLASK_", "BENCH_"))}
        self.env.update(PORT=str(self.port), PYTHONUNBUFFERED="1",
                        PARTNER_DATABASE_URL=f"sqlite:///{self.database}",
                        PARTNER_WEBHOOK_ALLOWED_NETWORKS='["127.0.0.0/8"]')
        self.env.update(env or {})
        self.env.update(SERVICE_ENV)
        self.process: subprocess.Popen | None = None
        self.base_url = f"http://{LOOPBACK}:{self.port}"

    def flask(self, *args: str) -> str:
        """Run an operator command (`flask ...`) against this service's database; its stdout."""
        result = subprocess.run([str(BIN / "flask"), *args], cwd=self.root, env=self.env,
                                capture_output=True, text=True, timeout=60)
        if result.returncode != 0:
            raise RuntimeError(f"flask {' '.join(args[:2])} failed: {result.stderr}")
        return result.stdout

    def create_key(self, org: str = "bench", scopes=("webhooks:manage",),
                   rate_limit: int = BIG_RATE_LIMIT) -> str:
        """`flask keys create`; the full key is the last line of stdout. Before the service's first
        start, the database is made as that start would (a command never makes one)."""
        subprocess.run([sys.executable, "-c", MAKE_DATABASE, self.env["PARTNER_DATABASE_URL"]], cwd=self.root,
                       env=self.env, check=True, timeout=120)
        args = ["keys", "create", "--org", org, "--rate-limit", str(rate_limit)]
        for scope in scopes:
            args += ["--scope", scope]
        return self.flask(*args).strip().splitlines()[-1]

    def start(self, wait: bool = True) -> "Service":
        """Start gunicorn; by default, return once it serves."""
        measured_revision()  # the code this gunicorn loads, not whatever is there when the bench ends
        self.log_out = open(self.workdir / f"{self.name}.out", "ab")
        self.log_err = open(self.workdir / f"{self.name}.err", "ab")
        self.log_err_start = self.log_err.tell()  # the name's earlier runs wrote before it
        self.process = subprocess.Popen([*self.launcher, str(BIN / "gunicorn"), "--no-control-socket", self.app],
                                        cwd=self.root, env=self.env, stdout=self.log_out,
                                        stderr=self.log_err, start_new_session=True)
        if wait:
            self.wait_until_serving()
        return self

    def scanners_started(self) -> int:
        """How many of its workers have started their delivery scanner (delivery.py logs it)."""
        with open(self.workdir / f"{self.name}.err", "rb") as err:
            err.seek(self.log_err_start)
            return err.read().count(b"delivery scanner started")

    def wait_until_serving(self) -> None:
        deadline = time.monotonic() + BOOT_SECONDS
        with http_session() as session:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise RuntimeError(f"{self.name} exited with {self.process.returncode}:\n"
                                       f"{self.stderr()[-3000:]}")
                try:
                    session.get(self.base_url + "/", timeout=2)
                    return
                except (requests.ConnectionError, requests.Timeout):
                    time.sleep(0.05)
        raise RuntimeError(f"{self.name} did not serve within {BOOT_SECONDS} s:\n{self.stderr()[-3000:]}")

    def stderr(self) -> str:
        return (self.workdir / f"{self.name}.err").read_text(errors="replace")

    def worker_pid(self) -> int:
        """The gunicorn worker: the master's one child process."""
        children = child_pids(self.process.pid)
        if len(children) != 1:
            raise RuntimeError(f"expected one gunicorn worker, found {children}")
        return children[0]

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=STOP_SECONDS)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)  # its own session: master and worker
                self.process.wait(timeout=STOP_SECONDS)
        self.log_out.close()
        self.log_err.close()
        self.process = None

    def __enter__(self) -> "Service":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def run_threads(target, count: int) -> None:
    """Run target(n) for each n in range(count), each on a thread of its own; wait for them all,
    and raise the first error any of them raised."""
    with ThreadPoolExecutor(max_workers=count) as pool:
        list(pool.map(target, range(count)))


# Code of the service's tree that brings a database up to date, as a start does (older trees: a
# command made it itself).
MAKE_DATABASE = ("import sys\ntry:\n    from tests.support import open_database\nexcept ImportError:\n    sys.exit()\n"
                 "open_database(sys.argv[1]).close_all()")


def wait_or_kill(process: subprocess.Popen, seconds: float = 30) -> None:
    """Give a signalled process `seconds` to end, then kill it."""
    try:
        process.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=5)


def child_pids(pid: int) -> list[int]:
    children = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                children.append(int(entry))
    return children


def memory_kib(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak RSS) of a process, in KiB."""
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            values[name] = int(rest.split()[0])
    return values


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def context_switches(pid: int) -> int:
    """Context switches, voluntary or not, of all of a process's threads so far."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            status = (task / "status").read_text()
        except FileNotFoundError:  # the thread ended meanwhile
            continue
        total += sum(int(line.split()[1]) for line in status.splitlines() if "ctxt_switches:" in line)
    return total


@contextmanager
def workdir(prefix: str):
    path = Path(tempfile.mkdtemp(prefix=f"bench-{prefix}-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


# --- the receiver -------------------------------------------------------------------------------

class Receiver:
    """bench/receiver.py in its own process; arrivals stream back on its stdout. With `tls`
    (certificate and key PEM paths) it serves HTTPS."""

    def __init__(self, tls: tuple[Path, Path] | None = None):
        self.tls = tls
        self.arrivals: dict[str, tuple[str, float]] = {}
        self.count = 0
        # Every request: (event id, path, arrival, status answered, requests to its path prefix under way).
        self.requests: list[tuple[str, str, float, int, int]] = []
        self.delivered: dict[str, float] = {}  # event id: its first 2xx's arrival
        self._changed = threading.Condition()
        self.process: subprocess.Popen | None = None

    def start(self) -> "Receiver":
        tls = ["--tls", *map(str, self.tls)] if self.tls else []
        self.process = subprocess.Popen([sys.executable, str(BENCH_DIR / "receiver.py"), *tls],
                                        stdout=subprocess.PIPE, start_new_session=True)
        first = self.process.stdout.readline().split()
        if first[:1] != [b"PORT"]:
            self.stop()
            raise RuntimeError("the receiver did not start")
        self.port = int(first[1])
        threading.Thread(target=self._read, daemon=True).start()
        return self

    def url(self, path: str, host: str = LOOPBACK) -> str:
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}{path}"

    def _read(self) -> None:
        for line in self.process.stdout:
            event_id, path, at, status, under_way = line.decode().split()
            with self._changed:
                self.arrivals.setdefault(event_id, (path, float(at)))  # the first arrival counts
                self.requests.append((event_id, path, float(at), int(status), int(under_way)))
                if 200 <= int(status) < 300:
                    self.delivered.setdefault(event_id, float(at))
                self.count += 1
                self._changed.notify_all()

    def wait_for_count(self, count: int, timeout: float) -> bool:
        with self._changed:
            return self._changed.wait_for(lambda: self.count >= count, timeout)

    def wait_for_delivered(self, count: int, timeout: float) -> bool:
        """Whether `count` events have had a 2xx within `timeout` seconds."""
        with self._changed:
            return self._changed.wait_for(lambda: len(self.delivered) >= count, timeout)

    def wait_for_event(self, event_id: str, timeout: float) -> float | None:
        """The arrival time (monotonic) of the event, or None if it did not come in time."""
        with self._changed:
            self._changed.wait_for(lambda: event_id in self.arrivals, timeout)
            arrival = self.arrivals.get(event_id)
        return arrival[1] if arrival else None

    def reset(self) -> None:
        with self._changed:
            self.arrivals.clear()
            self.requests.clear()
            self.delivered.clear()
            self.count = 0

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)

    def __enter__(self) -> "Receiver":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def partner_tls(directory: Path) -> tuple[tuple[Path, Path], Path]:
    """An HTTPS partner's key and certificate for 127.0.0.1, from a throwaway CA, and a
    production-size trust bundle for the service: requests' default store (certifi) with that CA
    appended, to pass as PARTNER_DELIVERY_CA_BUNDLE."""
    import certifi
    import trustme

    ca = trustme.CA()
    identity = directory / "receiver.pem"  # key and certificate chain in one file
    ca.issue_cert(LOOPBACK).private_key_and_cert_chain_pem.write_to_path(str(identity))
    bundle = directory / "ca-bundle.pem"
    bundle.write_bytes(Path(certifi.where()).read_bytes() + b"\n" + ca.cert_pem.bytes())
    return (identity, identity), bundle


# --- the API, as a partner calls it ---------------------------------------------------------------

class Partner:
    """A keep-alive HTTP client of the service with one API key."""

    def __init__(self, service: Service, key: str):
        self.service = service
        self.base = service.base_url + API
        self.session = http_session()
        self.session.headers["Authorization"] = f"Bearer {key}"

    def subscribe(self, url: str) -> dict:
        response = self.session.post(f"{self.base}/webhooks", json={"url": url}, timeout=30)
        if response.status_code != 201:
            self.fail("POST /webhooks", response)
        return response.json()

    def ping(self, subscription: dict) -> str:
        """POST .../test; the queued event's id."""
        response = self.session.post(f"{self.base}/webhooks/{subscription['id']}/test",
                                     json={"secret": subscription["secret"]}, timeout=30)
        if response.status_code != 202:
            self.fail("POST /webhooks/{id}/test", response)
        return response.json()["id"]

    def delete(self, subscription: dict) -> None:
        response = self.session.delete(f"{self.base}/webhooks/{subscription['id']}", timeout=30)
        if response.status_code != 204:
            self.fail("DELETE /webhooks/{id}", response)

    def failures(self, subscription: dict) -> list[dict]:
        """The newest page of the subscription's failure records."""
        response = self.session.get(f"{self.base}/webhooks/{subscription['id']}/failures",
                                    params={"limit": 100}, timeout=30)
        if response.status_code != 200:
            self.fail("GET /webhooks/{id}/failures", response)
        return response.json()["data"]

    def fail(self, what: str, response: requests.Response):
        raise RuntimeError(f"{what}: {response.status_code} {response.text[:300]}\n"
                           f"server log (tail):\n{self.service.stderr()[-3000:]}")

    def close(self) -> None:
        self.session.close()


def ping_many(service: Service, key: str, subscriptions: list[dict], count: int,
              threads: int = 8) -> float:
    """Queue `count` test pings round-robin over `subscriptions` through the API; returns seconds."""
    from concurrent.futures import ThreadPoolExecutor

    def worker(offset: int) -> None:
        partner = Partner(service, key)
        try:
            for i in range(offset, count, threads):
                partner.ping(subscriptions[i % len(subscriptions)])
        finally:
            partner.close()

    started = time.monotonic()
    with ThreadPoolExecutor(threads) as pool:
        for future in [pool.submit(worker, offset) for offset in range(threads)]:
            future.result()
    return time.monotonic() - started


def queue_backlog(tmp: Path, receiver: "Receiver", subscriptions: int, events: int, env: dict | None = None,
                  database: Path | None = None, path: str = "/ok") -> tuple[Path, float]:
    """`events` due test pings over `subscriptions` subscriptions to `receiver`, queued through the
    API with the scanner off, in `database` (or the PARTNER_DATABASE_URL in `env`): the SQLite
    file, and the seconds the pings took to queue."""
    quiet = Service(tmp, {"PARTNER_SCHEDULER_ENABLED": "false", **(env or {})}, name="enqueue", database=database)
    key = quiet.create_key()
    with quiet:
        partner = Partner(quiet, key)
        hooks = [partner.subscribe(receiver.url(f"{path}/{n}")) for n in range(subscriptions)]
        partner.close()
        return quiet.database, ping_many(quiet, key, hooks, events)


def slug(name: str) -> str:
    """A run's name as a file name: `1 worker, 8 slots` -> `1-worker-8-slots`."""
    return name.replace(",", "").replace(" ", "-")


def copy_of(database: Path, name: str) -> Path:
    """A copy of a SQLite database file beside it, for one run to drain. Checkpointed first: a tree
    that leaves its last commits in the -wal file when it stops (release 1.1 did) would lose them."""
    connection = sqlite3.connect(database)
    try:
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        connection.close()
    copy = database.with_name(f"{slug(name)}.sqlite3")
    shutil.copy(database, copy)
    return copy


def drain_backlog(tmp: Path, receiver: "Receiver", events: int, name: str, env: dict, app: str = "wsgi:app",
                  services: int = 1, database: Path | None = None, timeout: float = 300) -> tuple[float, float]:
    """Start `services` services on a database of `events` due pings to `receiver` (the SQLite file
    `database`, or the PARTNER_DATABASE_URL in `env`) and time the drain at the receiver:
    deliveries/s ((deliveries - 1) / (last arrival - first arrival)), and the workers' CPU
    milliseconds per delivery, read from /proc before they stop (a one-worker drain is profiled under
    BENCH_PROFILE, into bench/results/<name>.folded). Both count from the moment every
    worker's scanner runs: the services start together, but a worker that boots first drains
    alone meanwhile (by how long: docs/performance.md, "Drains measured from every worker
    scanning")."""
    receiver.reset()
    with ExitStack() as running:
        started = [Service(tmp, env, app=app, name=f"{slug(name)}-{n}", database=database) for n in range(services)]
        workers = start_scanning(started, running, name)
        scanning_from = time.monotonic()  # the receiver stamps arrivals on the same system-wide clock
        cpu_before = sum(cpu_seconds(pid) for pid in workers)
        with profiled(started[0], slug(name)) if len(workers) == 1 else nullcontext():
            if not receiver.wait_for_count(events, timeout):
                raise RuntimeError(f"{name}: {receiver.count} of {events} delivered in {timeout} s")
        time.sleep(0.2)  # the last outcomes are recorded
        cpu = sum(cpu_seconds(pid) for pid in workers) - cpu_before
    # Every request, not each event's first: a published event arrives once per subscription.
    arrivals = [at for _, _, at, _, _ in receiver.requests if at >= scanning_from]
    return (len(arrivals) - 1) / (max(arrivals) - min(arrivals)), cpu * 1000 / len(arrivals)


def start_scanning(services: list[Service], running: ExitStack, name: str) -> list[int]:
    """Start the services together (each stopped when `running` closes) and return their workers'
    pids once every worker's scanner runs."""
    for service in services:
        running.callback(service.stop)
        service.start(wait=False)
    for service in services:
        service.wait_until_serving()
    workers = [pid for service in services for pid in child_pids(service.process.pid)]
    deadline = time.monotonic() + BOOT_SECONDS
    while sum(service.scanners_started() for service in services) < len(workers):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name}: not every worker started its scanner in {BOOT_SECONDS} s")
        time.sleep(0.005)
    return workers


Pair = tuple[float, float]  # a drain's rate and worker CPU per delivery


def median_of_rounds(runs: dict[str, Callable[[str], Pair]], rounds: int) -> dict[str, Pair]:
    """Each run called `rounds` times with a name of its own, the runs taking turns within a round and
    each round starting with the next run; the medians of the pair each returns (a drain's rate and
    worker CPU per delivery). One drain moves by a fifth from run to run: a ratio of single drains
    is mostly noise."""
    results: dict[str, list[Pair]] = {name: [] for name in runs}
    turns = list(runs)
    for round_ in range(rounds):
        first = round_ % len(turns)
        for name in turns[first:] + turns[:first]:
            results[name].append(runs[name](f"{name} {round_}"))
    return {name: (statistics.median(a for a, _ in pairs), statistics.median(b for _, b in pairs))
            for name, pairs in results.items()}


def median_drains(tmp: Path, receiver: "Receiver", events: int, backlog: Path, runs: dict[str, tuple[str, dict]],
                  rounds: int, timeout: float = 300) -> dict[str, Pair]:
    """median_of_rounds of drain_backlog: each run's (app, env) drains a copy of `backlog`."""
    def drains(app: str, env: dict) -> Callable[[str], Pair]:
        return lambda run: drain_backlog(tmp, receiver, events, run, env, app=app, database=copy_of(backlog, run),
                                         timeout=timeout)
    return median_of_rounds({name: drains(app, env) for name, (app, env) in runs.items()}, rounds)


@contextmanager
def throwaway_postgresql():
    """A throwaway PostgreSQL server, as the tests start one, and a function giving the services'
    environment for one of its schemas (every service of one database is given the same keys); None
    when PostgreSQL is not installed."""
    sys.path.insert(0, str(REPO))
    from partner.sealing import new_key
    from tests.servers import postgres_bin_dir, start_postgres
    bin_dir = postgres_bin_dir()
    if bin_dir is None:
        yield None
        return
    server = start_postgres(bin_dir)
    keys = json.dumps([new_key()])
    try:
        yield server, lambda schema: {"PARTNER_DATABASE_URL": server.url(schema), "PARTNER_ENCRYPTION_KEYS": keys}
    finally:
        server.stop()


# --- figures and the report -----------------------------------------------------------------------

def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


@dataclass
class Figure:
    name: str
    value: float
    unit: str
    target: str = ""  # e.g. "≥ 0.70"; empty for context figures
    passed: bool | None = None  # None: not a target


def at_least(name, value, unit, bound) -> Figure:
    return Figure(name, value, unit, f"≥ {bound}", value >= bound)


def at_most(name, value, unit, bound) -> Figure:
    return Figure(name, value, unit, f"≤ {bound}", value <= bound)


def below(name, value, unit, bound) -> Figure:
    return Figure(name, value, unit, f"< {bound}", value < bound)


def info(name, value, unit) -> Figure:
    return Figure(name, value, unit)


def machine() -> dict:
    meminfo = Path("/proc/meminfo").read_text().splitlines()
    mem_kib = int(next(line for line in meminfo if line.startswith("MemTotal")).split()[1])
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor() or "unknown")
    return {"cores": os.cpu_count(), "memory_gib": round(mem_kib / 1024 ** 2, 1), "cpu": cpu,
            "kernel": platform.release(), "python": platform.python_version(),
            "sqlite": sqlite3.sqlite_version}


def revision() -> str:
    """The measured tree's git commit, with `+changes` when its working tree differs."""
    def git(*args):
        return subprocess.run(["git", "--no-optional-locks", *args], cwd=SERVICE_ROOT,
                              capture_output=True, text=True, timeout=10).stdout.strip()
    try:
        commit = git("rev-parse", "--short", "HEAD")
        if commit and git("rev-parse", "--show-toplevel") == str(SERVICE_ROOT):
            return commit + ("+changes" if git("status", "--porcelain", "--untracked-files=no") else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown"


_measured_revision: list[str] = []


def measured_revision() -> str:
    """revision() when the bench first started a service (or first asked), then always that."""
    if not _measured_revision:
        _measured_revision.append(revision())
    return _measured_revision[0]


def fmt(value: float) -> str:
    if isinstance(value, float) and not value.is_integer():
        return f"{value:,.3f}" if abs(value) < 10 else f"{value:,.1f}"
    return f"{int(value):,}"


def verdict(figure: Figure) -> str:
    return "" if figure.passed is None else ("PASS" if figure.passed else "MISS")


def table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    line = lambda row: "  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)).rstrip()
    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, rows)])


def report(bench: str, figures: list[Figure], parameters: dict, details: dict | None = None) -> dict:
    """Print the bench's table and write bench/results/<bench>.json."""
    result = {
        "bench": bench,
        "mode": "quick" if QUICK else "full",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "parameters": parameters,
        "service": {"root": str(SERVICE_ROOT), "revision": measured_revision(), "env": SERVICE_ENV},
        "figures": [asdict(figure) for figure in figures],
        "details": details or {},
    }
    m = result["machine"]
    print(f"\n== {bench} ({result['mode']} mode) — {result['date']} — {m['cores']} cores, "
          f"{m['memory_gib']} GiB, {m['cpu']}, Python {m['python']}, SQLite {m['sqlite']}")
    print(f"   service {result['service']['revision']}"
          + (f" with {SERVICE_ENV}" if SERVICE_ENV else "") + "; "
          + ", ".join(f"{k}={v}" for k, v in parameters.items()))
    rows = [[f.name, fmt(f.value), f.unit, f.target, verdict(f)] for f in figures]
    print(table(rows, ["figure", "value", "unit", "target", ""]))
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    (RESULTS_DIR / f"{bench}.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


# --- optional profiling ---------------------------------------------------------------------------

@contextmanager
def profiled(service: Service, name: str):
    """With BENCH_PROFILE=1 (all running threads) or BENCH_PROFILE=gil (only the thread holding the
    GIL: where the CPU goes) and py-spy installed (`.venv/bin/pip install py-spy`), sample the worker
    while the block runs into bench/results/<name>.folded (collapsed stacks, for speedscope). Without
    pausing it (--nonblocking): paused at each sample, a worker spent twice the CPU per delivery."""
    mode = os.environ.get("BENCH_PROFILE")
    spy = shutil.which("py-spy") or (str(BIN / "py-spy") if (BIN / "py-spy").exists() else None)
    if mode not in ("1", "gil") or not spy:
        yield
        return
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    output = RESULTS_DIR / f"{name}.folded"
    args = [spy, "record", "--pid", str(service.worker_pid()), "--rate", "250", "--format", "raw",
            "--threads", "--nonblocking", "-o", str(output)] + (["--gil"] if mode == "gil" else [])
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield
    finally:
        process.send_signal(signal.SIGINT)
        wait_or_kill(process)
