"""A real, throwaway Prometheus (Debian's `prometheus` package) scraping a service the test started, with
the repository's scrape config and alert rules: the fixture start_prometheus and the Prometheus handle."""

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
import yaml

from tests.servers import INSTALL_HINT, Watchdog, stop_server, wait_until
from tests.support import free_port

DEPLOY = Path(__file__).resolve().parent.parent / "deploy" / "prometheus"
# As often as Prometheus allows in practice: a rate needs two scrapes inside its window.
SCRAPE_SECONDS = 1


@dataclass
class Prometheus:
    port: int
    process: subprocess.Popen
    watchdog: Watchdog

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def query(self, expr: str) -> list[dict]:
        """The instant vector of `expr` now, through the HTTP API: [{"metric": {...}, "value": [t, "v"]}]."""
        answer = requests.get(f"{self.base_url}/api/v1/query", params={"query": expr}, timeout=10).json()
        assert answer["status"] == "success", answer
        return answer["data"]["result"]

    def stop(self) -> None:
        stop_server(self.process, self.watchdog)


def scrape_config(target: str) -> dict:
    """deploy/prometheus/prometheus.yml and its rules, pointed at `target` and scraping every second."""
    config = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    config["global"].update(scrape_interval=f"{SCRAPE_SECONDS}s", evaluation_interval=f"{SCRAPE_SECONDS}s")
    config["rule_files"] = [str(DEPLOY / name) for name in config["rule_files"]]
    [job] = config["scrape_configs"]
    job["static_configs"] = [{"targets": [target]}]
    return config


def _ready(port: int) -> bool:
    try:
        return requests.get(f"http://127.0.0.1:{port}/-/ready", timeout=1).status_code == 200
    except requests.RequestException:
        return False


@pytest.fixture
def start_prometheus(tmp_path):
    """start_prometheus("127.0.0.1:8000", consoles=dir): a Prometheus scraping that target (job "partner"),
    serving the console templates in `consoles`; stopped at teardown."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip(f"prometheus is not installed: {INSTALL_HINT}")
    started: list[Prometheus] = []

    def start(target: str, consoles: Path | None = None) -> Prometheus:
        config = tmp_path / "prometheus.yml"
        config.write_text(yaml.safe_dump(scrape_config(target)))
        consoles = consoles or tmp_path
        log = tmp_path / "prometheus.log"
        port = free_port()
        with open(log, "wb") as out:
            process = subprocess.Popen(
                [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{port}", f"--web.console.templates={consoles}",
                 f"--web.console.libraries={consoles}"],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        started.append(Prometheus(port, process, Watchdog(f"kill {process.pid}")))
        wait_until(lambda: _ready(port), process, "prometheus", log)
        return started[-1]

    yield start
    for server in started:
        server.stop()
