"""A real gunicorn as `make run` starts it, for the tests where process behaviour matters: the
fixtures server_env, smoke_key, gunicorn and session, the Gunicorn process handle, and partners
calling it (Partner, PingLoad)."""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import requests

from tests.support import ENCRYPTION_KEYS, WEBHOOKS, bearer, eventually, free_port, open_database

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent  # the virtualenv the suite runs in: gunicorn and flask live beside python
BOOT_SECONDS = 10
STOP_SECONDS = 5

# None leaves PARTNER_SCHEDULER_ENABLED unset (enabled): post_worker_init starts the delivery
# scanner in the worker, as in production. Set "false" to boot without it.
SCHEDULER_ENABLED = None


@pytest.fixture
def server_env(database_url):
    """The environment of `make run`: ours, minus anything that would configure the app or gunicorn.
    The database is conftest's `database_url`: SQLite, or PostgreSQL too under both_databases."""
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("PARTNER_", "GUNICORN_", "FLASK_"))}  # the suite's keys are put back
    env.update(PORT=str(free_port()), PYTHONUNBUFFERED="1", PARTNER_DATABASE_URL=database_url,
               PARTNER_ENCRYPTION_KEYS=json.dumps(ENCRYPTION_KEYS))
    if SCHEDULER_ENABLED is not None:
        env["PARTNER_SCHEDULER_ENABLED"] = SCHEDULER_ENABLED
    return env


FLASK = (str(BIN / "flask"),)


def run_flask(env, *args: str, timeout: float = 60, launcher: tuple[str, ...] = FLASK) -> subprocess.CompletedProcess:
    """The operator CLI in a process of its own, as an operator runs it, with `env` as its environment."""
    return subprocess.run([*launcher, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


def flask(env, *args: str) -> str:
    """Run the operator CLI in a process of its own, as an operator would; its last line."""
    result = run_flask(env, *args, timeout=30)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().splitlines()[-1]


@pytest.fixture
def smoke_key(server_env):
    """A key issued before the service starts: into the database its first start would have made."""
    open_database(server_env["PARTNER_DATABASE_URL"]).close_all()
    return flask(server_env, "keys", "create", "--org", "smoke", "--scope", "webhooks:manage")


class Gunicorn:
    """`launcher`: what runs gunicorn, as for run_flask (e.g. `open_files_limit(1024)`)."""

    def __init__(self, env, log_dir: Path, app_module: str = "wsgi:app", launcher: tuple[str, ...] = ()):
        self.port = int(env["PORT"])
        self.base_url = f"http://127.0.0.1:{self.port}"
        log_dir.mkdir(parents=True, exist_ok=True)
        self.out_path, self.err_path = log_dir / "gunicorn.out", log_dir / "gunicorn.err"
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            # No control socket: it would live in $HOME and be shared with any other gunicorn.
            self.process = subprocess.Popen([*launcher, BIN / "gunicorn", "--no-control-socket", app_module],
                                            cwd=ROOT, env=env, stdout=out, stderr=err)

    def worker_pids(self) -> list[int]:
        """The master's children: its workers."""
        pid = self.process.pid
        return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]

    def output(self) -> tuple[str, str]:
        return self.out_path.read_text(), self.err_path.read_text()

    def wait_until_serving(self, session: requests.Session) -> None:
        """Poll until the worker answers HTTP; fail with gunicorn's own output if it dies or hangs."""
        def serving() -> bool:
            if self.process.poll() is not None:
                pytest.fail(f"gunicorn exited with {self.process.returncode} before serving:\n"
                            f"{self.output()[1]}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                session.get(self.base_url + "/", timeout=2)
                return True
            except (OSError, requests.ConnectionError, requests.Timeout):
                return False
        if not eventually(serving, BOOT_SECONDS, pause=0.1):
            pytest.fail(f"gunicorn did not serve within {BOOT_SECONDS} s:\n{self.output()[1]}")

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=STOP_SECONDS)


def open_files_limit(descriptors: int) -> tuple[str, ...]:
    """A launcher that runs its command with RLIMIT_NOFILE at `descriptors`, as systemd's LimitNOFILE= does."""
    return (sys.executable, "-c", "import os, resource, sys; "
            f"resource.setrlimit(resource.RLIMIT_NOFILE, ({descriptors}, {descriptors})); "
            "os.execv(sys.argv[1], sys.argv[1:])")


@pytest.fixture
def gunicorn(server_env, smoke_key, tmp_path):
    server = Gunicorn(server_env, tmp_path)
    yield server
    if server.process.poll() is None:
        server.process.kill()
        server.process.wait(timeout=STOP_SECONDS)


@pytest.fixture
def session():
    with requests.Session() as http:
        http.trust_env = False  # no proxy variables, no .netrc: loopback only
        # No idle keep-alive connection for a graceful stop to wait out.
        http.headers["Connection"] = "close"
        yield http


class Partner:
    """One organization's calls to the live service, on a session per thread (loopback only)."""

    def __init__(self, base_url: str, key: str):
        self.base_url, self.key = base_url, key
        self.api = base_url + WEBHOOKS
        self._local = threading.local()

    @property
    def http(self) -> requests.Session:
        if not hasattr(self._local, "http"):
            self._local.http = _http()
            self._local.http.headers.update(bearer(self.key))
        return self._local.http

    def create(self, url: str) -> requests.Response:
        return self.http.post(self.api, json={"url": url}, timeout=10)

    def subscribe(self, url: str) -> dict:
        response = self.create(url)
        assert response.status_code == 201, response.text
        return response.json()

    def ping(self, subscription: dict) -> str:
        response = self.http.post(f"{self.api}/{subscription['id']}/test", timeout=10,
                                  json={"secret": subscription["secret"]})
        assert response.status_code == 202, response.text
        return response.json()["id"]

    def delete(self, subscription: dict) -> None:
        assert self.http.delete(f"{self.api}/{subscription['id']}", timeout=10).status_code == 204

    def get(self, path: str) -> dict:
        response = self.http.get(self.api + path, timeout=10)
        assert response.status_code == 200, response.text
        return response.json()


class PingLoad:
    """Partners pinging a live service without pause: one thread per subscription, each creating
    its subscription at `receiver_url/<n>` and then POSTing .../test until stop(). `events` holds
    the ids of the pings answered 202, in order; `answers` every status."""

    def __init__(self, base_url: str, key: str, receiver_url: str, feeders: int, pause: float = 0.0):
        self.api, self.pause = base_url + "/api/v1/partner/webhooks", pause
        self.auth = {"Authorization": f"Bearer {key}"}
        self.events, self.answers, self.stopped = [], [], threading.Event()
        with _http() as http:
            self.subscriptions = [http.post(self.api, json={"url": f"{receiver_url}/{n}"}, headers=self.auth,
                                            timeout=5).json() for n in range(feeders)]
        self.threads = [threading.Thread(target=self._ping, args=(s,)) for s in self.subscriptions]
        for thread in self.threads:
            thread.start()

    def _ping(self, subscription: dict) -> None:
        with _http() as http:
            while not self.stopped.is_set():
                response = http.post(f"{self.api}/{subscription['id']}/test", headers=self.auth, timeout=10,
                                     json={"secret": subscription["secret"]})
                self.answers.append(response.status_code)
                if response.status_code == 202:
                    self.events.append(response.json()["id"])
                self.stopped.wait(self.pause)

    def stop(self) -> None:
        self.stopped.set()
        for thread in self.threads:
            thread.join()


def _http() -> requests.Session:
    http = requests.Session()
    http.trust_env = False  # no proxy variables: loopback only
    return http
