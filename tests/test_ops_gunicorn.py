"""The ops features where process behaviour matters, on real gunicorn: metrics summed across
workers (multiprocess mode, prepared by gunicorn.conf.py) and JSON log lines."""

import json
import os
import signal
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from prometheus_client.mmap_dict import MmapedDict
from prometheus_client.parser import text_string_to_metric_families

from partner.store.connection import sqlite_file
from tests.support import PUBLIC_IP, WEBHOOKS, eventually, free_port
from tests.gunicorn_server import Gunicorn

REQUESTS = 120


@pytest.fixture
def start_gunicorn(server_env, tmp_path, session):
    started = []

    def start(**env) -> Gunicorn:
        server = Gunicorn({**server_env, "PARTNER_SCHEDULER_ENABLED": "false", **env}, tmp_path)
        started.append(server)
        server.wait_until_serving(session)
        return server
    yield start
    for server in started:
        if server.process.poll() is None:
            server.process.kill()
            server.process.wait(timeout=5)


def healthz_count(text: str) -> float:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "partner_http_requests_total" and sample.labels["route"] == "/healthz":
                return sample.value
    return 0.0


def healthz_count_per_worker(metrics_dir: Path) -> dict[str, float]:
    """What each worker wrote to its own file: proof that both served, not just one."""
    counts = {}
    for path in metrics_dir.glob("counter_*.db"):
        counts[path.stem] = sum(value for key, value, _, _ in MmapedDict.read_all_values_from_file(path)
                                if '"partner_http_requests_total"' in key and '"/healthz"' in key)
    return counts


@pytest.mark.parametrize("options", ["--workers 2", "--workers 2 --preload"])
def test_metrics_counted_across_two_workers_add_up_and_outlive_a_worker(start_gunicorn, session, tmp_path,
                                                                       options):
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()
    (metrics_dir / "counter_999999.db").write_bytes(b"stale")  # a previous run's: removed at start
    server = start_gunicorn(GUNICORN_CMD_ARGS=options, PROMETHEUS_MULTIPROC_DIR=str(metrics_dir))
    served = 0
    with ThreadPoolExecutor(8) as pool:
        while True:  # until both workers have served some (the kernel decides who accepts)
            statuses = list(pool.map(lambda _: session.get(server.base_url + "/healthz", timeout=5)
                                     .status_code, range(REQUESTS)))
            assert statuses == [200] * REQUESTS
            served += REQUESTS
            per_worker = healthz_count_per_worker(metrics_dir)
            if sum(1 for count in per_worker.values() if count) >= 2 or served >= 10 * REQUESTS:
                break
    assert sum(1 for count in per_worker.values() if count) == 2, per_worker
    for _ in range(4):  # whichever worker answers the scrape reports every worker's requests
        assert healthz_count(session.get(server.base_url + "/metrics", timeout=5).text) == served
    workers = server.worker_pids()
    os.kill(workers[0], signal.SIGKILL)  # gunicorn starts another in its place
    assert eventually(lambda: set(server.worker_pids()) - set(workers))
    for _ in range(4):  # the dead worker's counts are still counted
        assert healthz_count(session.get(server.base_url + "/metrics", timeout=5).text) == served
    assert server.stop() == 0


def test_a_fresh_service_exports_its_known_labelled_counters_at_zero(start_gunicorn, session, tmp_path):
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()
    server = start_gunicorn(PROMETHEUS_MULTIPROC_DIR=str(metrics_dir))
    samples = {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
               for family in text_string_to_metric_families(session.get(server.base_url + "/metrics", timeout=5).text)
               for sample in family.samples}
    for kind in ("organization", "failed_auth"):
        assert samples[("partner_rate_limited_total", (("kind", kind),))] == 0
    for outcome in ("delivered", "timeout", "connection_error", "http_status"):
        assert samples[("partner_delivery_attempts_total", (("event", "vc.test.ping"), ("outcome", outcome)))] == 0
    assert server.stop() == 0


def test_preloaded_workers_count_their_deliveries(start_gunicorn, session, smoke_key, receiver):
    server = start_gunicorn(GUNICORN_CMD_ARGS="--workers 2 --preload", PARTNER_SCHEDULER_ENABLED="true",
                            PARTNER_WEBHOOK_ALLOWED_NETWORKS='["127.0.0.0/8"]')
    headers = {"Authorization": f"Bearer {smoke_key}"}
    subscription = session.post(server.base_url + WEBHOOKS, json={"url": receiver.url}, headers=headers,
                                timeout=5).json()
    for _ in range(10):
        assert session.post(f"{server.base_url}{WEBHOOKS}/{subscription['id']}/test", headers=headers,
                            json={"secret": subscription["secret"]}, timeout=5).status_code == 202
    assert receiver.wait_for(10)

    def delivered() -> list[float]:  # the last outcome is counted after it is recorded
        return [sample.value for family in text_string_to_metric_families(
                session.get(server.base_url + "/metrics", timeout=5).text) for sample in family.samples
                if sample.name == "partner_delivery_attempts_total" and sample.labels["outcome"] == "delivered"]
    assert eventually(lambda: delivered() == [10.0]), delivered()
    assert server.stop() == 0


def test_json_log_lines_parse_and_carry_the_request_id(start_gunicorn, session, smoke_key, receiver):
    server = start_gunicorn(PARTNER_LOG_FORMAT="json", PARTNER_SCHEDULER_ENABLED="true",
                            PARTNER_WEBHOOK_ALLOWED_NETWORKS='["127.0.0.0/8"]')
    auth = {"Authorization": smoke_key}
    session.get(server.base_url + "/api/v1/partner/me", headers={"X-Request-Id": "trace-7.a_b", **auth},
                timeout=5)
    subscription = session.post(server.base_url + WEBHOOKS, json={"url": receiver.url}, headers=auth,
                                timeout=5).json()
    event = session.post(f"{server.base_url}{WEBHOOKS}/{subscription['id']}/test",
                         json={"secret": subscription["secret"]}, headers=auth, timeout=5).json()
    assert receiver.wait_for(1)
    assert server.stop() == 0
    out, err = server.output()
    access = [json.loads(line) for line in out.splitlines()]
    line = next(line for line in access if line.get("request_id") == "trace-7.a_b")
    assert (line["method"], line["path"], line["status"]) == ("GET", "/api/v1/partner/me", 200)
    assert line["name"] == "gunicorn.access" and "time" in line and "level" in line
    service = [json.loads(line) for line in err.splitlines()]
    assert any(line["message"].startswith("Booting worker") for line in service)
    delivery = next(line for line in service if line.get("event_id") == event["id"])
    assert {key: delivery[key] for key in ("subscription_id", "attempt", "outcome", "status")} == \
        {"subscription_id": subscription["id"], "attempt": 1, "outcome": "delivered", "status": 200}
    assert isinstance(delivery["duration_ms"], int)
    secret = smoke_key.split(".", 1)[1]
    assert secret not in out + err and subscription["secret"] not in out + err


def test_an_unknown_log_format_stops_start_up_naming_the_setting(server_env, tmp_path):
    server = Gunicorn({**server_env, "PARTNER_LOG_FORMAT": "xml"}, tmp_path)
    assert server.process.wait(timeout=30) != 0
    assert "PARTNER_LOG_FORMAT" in server.output()[1]


OPS_ENDPOINTS = ("/healthz", "/readyz", "/metrics", "/openapi.json", "/docs", "/docs/init.js")


def assert_ops_port_serves(session, server: Gunicorn, ops_port: int, key: str) -> None:
    """The operator's endpoints on the ops port only, the partner API on the partner port only."""
    ops, auth = f"http://127.0.0.1:{ops_port}", {"Authorization": f"Bearer {key}"}
    for path in OPS_ENDPOINTS:
        assert session.get(ops + path, timeout=5).status_code == 200, path
        elsewhere = session.get(server.base_url + path, timeout=5)
        assert (elsewhere.status_code, elsewhere.headers["Content-Type"]) == (404, "application/problem+json"), path
    assert session.get(server.base_url + WEBHOOKS, headers=auth, timeout=5).status_code == 200
    on_the_ops_port = session.get(ops + WEBHOOKS, headers=auth, timeout=5)
    assert (on_the_ops_port.status_code, on_the_ops_port.json()["code"]) == (404, "not_found")


# A bind on the command line replaces gunicorn.conf.py's, so it names both ports.
@pytest.mark.parametrize("options", ["", "--bind 127.0.0.1:{port} --bind 127.0.0.1:{ops_port}"])
def test_with_an_ops_port_the_operator_endpoints_answer_there_and_nowhere_else(start_gunicorn, server_env,
                                                                               session, smoke_key, options):
    ops_port = free_port()
    server = start_gunicorn(PARTNER_OPS_PORT=str(ops_port),
                            GUNICORN_CMD_ARGS=options.format(port=server_env["PORT"], ops_port=ops_port))
    assert_ops_port_serves(session, server, ops_port, smoke_key)


def test_a_reload_keeps_the_ops_port(start_gunicorn, session, smoke_key):
    """systemctl reload (deploy/systemd) sends SIGHUP: gunicorn reads its settings again, and a bind
    list that changed would be bound anew while the old worker still holds it (the master died)."""
    ops_port = free_port()
    server = start_gunicorn(PARTNER_OPS_PORT=str(ops_port))
    server.process.send_signal(signal.SIGHUP)
    eventually(lambda: server.output()[1].count("Booting worker") >= 2)
    assert server.output()[1].count("Booting worker") == 2 and server.process.poll() is None, server.output()[1]
    assert_ops_port_serves(session, server, ops_port, smoke_key)


@pytest.mark.parametrize("value, refusal", [
    ("70000", "PARTNER_OPS_PORT must be a TCP port number"),
    ("{free}", "but the server does not listen on it"),  # a bind of one's own that leaves it out
    ("{port}", "the only port the server listens on"),
])
def test_an_ops_port_that_cannot_be_served_stops_start_up_in_one_line(server_env, tmp_path, value, refusal):
    env = {**server_env, "PARTNER_OPS_PORT": value.format(free=free_port(), port=server_env["PORT"]),
           "GUNICORN_CMD_ARGS": f"--bind 127.0.0.1:{server_env['PORT']}"}
    server = Gunicorn(env, tmp_path)
    assert server.process.wait(timeout=30) != 0
    stderr = server.output()[1]
    assert refusal in stderr and "Traceback" not in stderr, stderr


def test_started_beside_a_held_write_lock_it_serves_reads_and_is_ready_soon_after_the_lock_is_let_go(
        start_gunicorn, server_env, session, smoke_key):
    """An operator's sqlite3 shell holds the write lock while the service starts, with no scheduler
    to notice the end of the outage: it boots and stays up, reads answer, writes get a 503, and
    within 20 s of the shell letting go it is ready and takes writes."""
    shell = sqlite3.connect(sqlite_file(server_env["PARTNER_DATABASE_URL"]), isolation_level=None)
    shell.execute("BEGIN IMMEDIATE")
    server = start_gunicorn()
    auth = {"Authorization": f"Bearer {smoke_key}"}
    assert session.get(server.base_url + "/api/v1/partner/me", headers=auth, timeout=10).status_code == 200
    refused = session.post(server.base_url + WEBHOOKS, json={"url": f"https://{PUBLIC_IP}/hook"}, headers=auth,
                           timeout=10)
    assert refused.status_code == 503 and refused.headers["Content-Type"] == "application/problem+json"
    assert session.get(server.base_url + "/readyz", timeout=10).status_code == 503
    shell.execute("ROLLBACK")
    shell.close()
    assert eventually(lambda: session.get(server.base_url + "/readyz", timeout=10).status_code == 200, 20)
    created = session.post(server.base_url + WEBHOOKS, json={"url": f"https://{PUBLIC_IP}/hook"}, headers=auth,
                           timeout=10)
    assert created.status_code == 201, created.text
    assert server.process.poll() is None and "Traceback" not in server.output()[1]
