"""deploy/grafana/partner-dashboard.json: every panel's query returns data from a real Prometheus scraping a
real gunicorn that delivered, failed, dead-lettered, auto-disabled and refused over its budget. Grafana
itself is not installable here, so the picture in docs/operations.md is the same queries drawn by
Prometheus's own console graphs (UPDATE_SCREENSHOT=1 stores it as docs/dashboard.png)."""

import html
import json
import math
import os
import re
import time
from pathlib import Path

import pytest

from tests.gunicorn_server import flask
from tests.receivers import hang, late
from tests.support import chromium, eventually

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = json.loads((ROOT / "deploy" / "grafana" / "partner-dashboard.json").read_text())
SCREENSHOT = ROOT / "docs" / "dashboard.png"
# Grafana's $__rate_interval with a 15 s scrape; long enough here for the minute the test lasts.
RATE_INTERVAL = "1m"
# The refreshed picture shows this much traffic; the test itself needs only what each query needs.
PICTURE_SECONDS = 240


def targets() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every query of every panel, as Grafana would send it."""
    return [(panel["title"], target["expr"].replace("$__rate_interval", RATE_INTERVAL))
            for panel in DASHBOARD["panels"] for target in panel["targets"]]


@pytest.fixture
def server_env(server_env):
    """Deliveries to loopback receivers, each failure final (no retries), auto-disable at the second."""
    return {**server_env, "PARTNER_WEBHOOK_ALLOWED_NETWORKS": '["127.0.0.0/8"]',
            "PARTNER_DELIVERY_RETRY_DELAYS": "[]", "PARTNER_AUTO_DISABLE_THRESHOLD": "2",
            "PARTNER_DELIVERY_TIMEOUT": "1"}


class Partner:
    """The smoke organization's calls to the live service."""

    def __init__(self, session, base_url: str, key: str):
        self.session, self.api = session, f"{base_url}/api/v1/partner"
        self.headers = {"Authorization": f"Bearer {key}"}

    def subscribe(self, url: str) -> dict:
        response = self.session.post(f"{self.api}/webhooks", json={"url": url}, headers=self.headers, timeout=10)
        assert response.status_code == 201, response.text
        return response.json()

    def ping(self, subscription: dict) -> int:
        return self.session.post(f"{self.api}/webhooks/{subscription['id']}/test", headers=self.headers,
                                 json={"secret": subscription["secret"]}, timeout=10).status_code


def has_data(result: list[dict]) -> bool:
    return any(not math.isnan(float(series["value"][1])) for series in result)


def total(result: list[dict]) -> float:
    return sum(float(series["value"][1]) for series in result if not math.isnan(float(series["value"][1])))


def test_every_panel_query_returns_data_from_a_real_prometheus_scraping_the_service(
        gunicorn, session, smoke_key, server_env, start_receiver, start_prometheus, tmp_path):
    gunicorn.wait_until_serving(session)
    consoles = tmp_path / "consoles"
    consoles.mkdir()
    (consoles / "partner.html").write_text(console_page())
    prometheus = start_prometheus(f"127.0.0.1:{gunicorn.port}", consoles)
    assert eventually(lambda: total(prometheus.query('up{job="partner"}')) == 1, seconds=30)

    partner = Partner(session, gunicorn.base_url, smoke_key)
    healthy = partner.subscribe(start_receiver().url)
    slow = partner.subscribe(start_receiver(script=[late(0.2)]).url)
    failing = partner.subscribe(start_receiver(script=[500]).url)
    hanging = partner.subscribe(start_receiver(script=[hang(3)]).url)
    # Two dead letters each (no retries), then each is auto-disabled: by status, by timeout.
    assert [partner.ping(failing), partner.ping(failing), partner.ping(hanging), partner.ping(hanging)] == [202] * 4
    tiny = Partner(session, gunicorn.base_url, flask(server_env, "keys", "create", "--org", "tiny", "--rate-limit", "1"))

    def busy_until(condition, seconds: float = 90) -> bool:
        """Partners keep calling (so every rate has something to count) until `condition()` holds."""
        def step():
            partner.ping(healthy)
            partner.ping(slow)
            session.get(f"{tiny.api}/me", headers=tiny.headers, timeout=10)  # over its budget of 1: 429
            return condition()
        return eventually(step, seconds=seconds, pause=0.2)

    answers = {}

    def every_query_answers() -> bool:
        answers.update({expr: prometheus.query(expr) for _, expr in targets()})
        return all(map(has_data, answers.values()))

    assert busy_until(every_query_answers), {expr: result for expr, result in answers.items() if not has_data(result)}
    by_title = {title: answers[expr] for title, expr in targets()}
    outcomes = {series["metric"]["outcome"] for series in by_title["Attempts per second, by outcome"]}
    assert {"delivered", "http_status"} <= outcomes
    assert total(by_title["Attempts per second, by outcome"]) > 0
    limited = {series["metric"]["kind"]: float(series["value"][1]) for series in by_title["Rate-limited requests per second"]}
    assert set(limited) == {"organization", "failed_auth"}  # both exported from the start, at zero until counted
    assert [kind for kind, rate in limited.items() if rate > 0] == ["organization"]
    dead_letters, auto_disables = dead_and_disabled()
    assert busy_until(lambda: total(prometheus.query(dead_letters)) >= 4 and total(prometheus.query(auto_disables)) >= 2)

    if os.environ.get("UPDATE_SCREENSHOT"):
        started = time.monotonic()
        busy_until(lambda: time.monotonic() - started > PICTURE_SECONDS, seconds=PICTURE_SECONDS + 30)
    picture = SCREENSHOT if os.environ.get("UPDATE_SCREENSHOT") else tmp_path / "dashboard.png"
    take_screenshot(f"{prometheus.base_url}/consoles/partner.html", picture, tmp_path / "profile")


def dead_and_disabled() -> list[str]:
    [panel] = [p for p in DASHBOARD["panels"] if p["title"].startswith("Dead letters")]
    return [target["expr"] for target in panel["targets"]]


def console_page() -> str:
    """A Prometheus console template drawing every panel of the dashboard, with its queries and legends,
    in the dashboard's three columns (Prometheus's own graph library, prom_console.js)."""
    cells = []
    for number, panel in enumerate(DASHBOARD["panels"]):
        graph = {"expr": [target["expr"].replace("$__rate_interval", RATE_INTERVAL) for target in panel["targets"]],
                 "name": [re.sub(r"\{\{(\w+)\}\}", r"[[ \1 ]]", target["legendFormat"]) for target in panel["targets"]],
                 "duration": PICTURE_SECONDS if os.environ.get("UPDATE_SCREENSHOT") else 120,
                 "height": 140, "width": 1200 if panel["gridPos"]["w"] == 24 else 380, "min": 0,
                 "yUnits": {"s": " s", "reqps": "/s"}.get(panel["fieldConfig"]["defaults"]["unit"], "")}
        wide = " wide" if panel["gridPos"]["w"] == 24 else ""
        cells.append(f'<div class="cell{wide}"><h6>{html.escape(panel["title"])}</h6><div id="g{number}"></div>'
                     f'<script>new PromConsole.Graph(Object.assign({{node: document.getElementById("g{number}"), '
                     f'yAxisFormatter: PromConsole.NumberFormatter.humanizeNoSmallPrefix}}, {json.dumps(graph)}))'
                     f'</script></div>')
    # Go's template engine reads this file: nothing in it may look like {{ }}.
    return CONSOLE_PAGE.replace("CELLS", "\n".join(cells)).replace("TITLE", html.escape(DASHBOARD["title"]))


CONSOLE_PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>TITLE</title>
<link rel="stylesheet" href="/classic/static/rickshaw/rickshaw.min.css">
<link rel="stylesheet" href="/classic/static/bootstrap4/css/bootstrap.min.css">
<link rel="stylesheet" href="/classic/static/css/prom_console.css">
<script src="/classic/static/d3/d3.min.js"></script>
<script src="/classic/static/rickshaw/rickshaw.min.js"></script>
<script src="/classic/static/jquery/jquery.min.js"></script>
<script>var PATH_PREFIX = "";</script>
<script src="/classic/static/js/prom_console.js"></script>
<style>
body { padding: 12px; } h4 { margin-bottom: 12px; }
.panels { display: grid; grid-template-columns: repeat(3, 400px); gap: 10px 16px; }
.cell.wide { grid-column: 1 / 4; } h6 { margin: 0 0 4px; font-weight: 600; }
</style></head>
<body><h4>TITLE <small class="text-muted">(deploy/grafana/partner-dashboard.json, drawn by Prometheus)</small></h4>
<div class="panels">
CELLS
</div></body></html>
"""


def take_screenshot(url: str, target: Path, profile: Path) -> None:
    shot = chromium("--window-size=1260,1000", f"--screenshot={target}", url, profile=profile)
    assert shot.returncode == 0, shot.stderr[-2000:]
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert target.stat().st_size > 30_000  # graphs drawn, not a blank page
