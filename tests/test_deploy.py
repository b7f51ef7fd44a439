"""The deployment kit in deploy/, exercised for real: the nginx site's locations in front of a real
gunicorn, and the Prometheus config and alert rules through promtool. Each test skips, saying why,
when its program is not installed (scripts/test-services.sh installs both)."""

import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.gunicorn_server import ROOT, Gunicorn
from tests.support import ME, SLACK_SECONDS, WEBHOOKS, bearer, eventually, free_port

DEPLOY = ROOT / "deploy"
NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
PROMTOOL = shutil.which("promtool")
FAILED_AUTH_BUDGET = 3

# The shipped site's server block, with a plain listener on a free loopback port instead of TLS:
# the locations, the part that decides what the public reaches, are the shipped file itself.
NGINX_CONFIG = """
worker_processes 1;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log;
events {{ worker_connections 512; }}
http {{
    access_log off;
    client_body_temp_path {prefix}/body;
    proxy_temp_path {prefix}/proxy;
    upstream partner_service {{ server 127.0.0.1:{upstream}; }}
    server {{
        listen 127.0.0.1:{port};
        include {locations};
    }}
}}
"""


@pytest.fixture
def service(server_env, smoke_key, tmp_path, session):
    env = {**server_env, "PARTNER_TRUSTED_PROXIES": "1", "PARTNER_SCHEDULER_ENABLED": "false",
           "PARTNER_AUTH_FAILURE_RATE_LIMIT": str(FAILED_AUTH_BUDGET)}
    server = Gunicorn(env, tmp_path / "gunicorn")
    server.wait_until_serving(session)
    yield server
    server.stop()


@pytest.fixture
def proxy(service, tmp_path):
    """nginx with deploy/nginx/partner-locations.conf in front of the service; its base URL."""
    if NGINX is None:
        pytest.skip("nginx is not installed (scripts/test-services.sh installs it)")
    prefix, port = tmp_path / "nginx", free_port()
    prefix.mkdir()
    config = prefix / "nginx.conf"
    config.write_text(NGINX_CONFIG.format(prefix=prefix, upstream=service.port, port=port,
                                          locations=DEPLOY / "nginx" / "partner-locations.conf"))
    process = subprocess.Popen([NGINX, "-p", str(prefix), "-c", str(config), "-g", "daemon off; user root;"],
                               stderr=subprocess.PIPE)
    def listening() -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return True
        except OSError:
            return process.poll() is not None  # it exited: no use waiting
    if not eventually(listening, 10) or process.poll() is not None:
        process.kill()
        pytest.fail(f"nginx did not start: {process.stderr.read().decode()}")
    yield port
    process.terminate()
    process.wait(timeout=10)


def get(port: int, path: str, headers: dict | None = None, source: str = "127.0.0.1") -> tuple[int, dict, bytes]:
    lines = "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())
    request = f"GET {path} HTTP/1.1\r\nHost: api.example.test\r\nConnection: close\r\n{lines}\r\n".encode()
    return exchange(port, request, source)


def exchange(port: int, request: bytes, source: str = "127.0.0.1") -> tuple[int, dict, bytes]:
    """The request's bytes as they are, from loopback address `source`. Unlike support.raw_exchange
    it never half-closes: nginx takes a client's FIN for an abandoned request (499)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0)) as sock:
        sock.sendall(request)
        answer = b"".join(iter(lambda: sock.recv(65536), b""))
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {name.lower(): value for name, _, value in (line.partition(": ") for line in header_lines)}
    return int(status_line.split()[1]), headers, body


def test_the_partner_api_answers_through_the_proxy(proxy, smoke_key):
    status, headers, body = get(proxy, ME, bearer(smoke_key))
    assert (status, headers["content-type"]) == (200, "application/json")
    assert b'"organization":"smoke"' in body


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/metrics", "/docs", "/openapi.json", "/"])
def test_the_operator_endpoints_are_not_reachable_through_the_proxy(proxy, path):
    status, headers, body = get(proxy, path)
    assert (status, headers["content-type"]) == (404, "application/problem+json")
    assert b'"code":"not_found"' in body


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_an_oversized_body_is_refused_by_the_proxy_as_a_problem(proxy, smoke_key, framing):
    body = b'{"url": "' + b"a" * (1024 * 1024) + b'"}'
    if framing == "chunked":
        length = "Transfer-Encoding: chunked\r\n"
        body = f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
    else:
        length = f"Content-Length: {len(body)}\r\n"
    request = (f"POST {WEBHOOKS} HTTP/1.1\r\nHost: api.example.test\r\nConnection: close\r\n"
               f"Authorization: Bearer {smoke_key}\r\nContent-Type: application/json\r\n{length}\r\n").encode()
    status, headers, answer = exchange(proxy, request + body)
    assert (status, headers["content-type"]) == (413, "application/problem+json")
    assert b'"code":"payload_too_large"' in answer


def test_two_clients_behind_the_proxy_have_separate_failed_authentication_budgets(proxy):
    wrong = bearer("vck_" + "A" * 20 + "." + "B" * 43)
    first = [get(proxy, ME, wrong, source="127.0.0.2")[0] for _ in range(FAILED_AUTH_BUDGET + 1)]
    assert first == [401] * FAILED_AUTH_BUDGET + [429]
    assert get(proxy, ME, wrong, source="127.0.0.3")[0] == 401  # another client: a budget of its own
    # A forwarded header of the client's own choosing buys no fresh budget: nginx replaces it.
    spoofed = {**wrong, "X-Forwarded-For": "203.0.113.9"}
    assert get(proxy, ME, spoofed, source="127.0.0.2")[0] == 429


SLOW_HEADERS, SLOW_BODIES = 48, 8
# nginx drops a silent client after the kit's 10 s (its default is a minute).
DROPPED_WITHIN_SECONDS = 20


def slow_client(port: int, request: bytes) -> socket.socket:
    """A client that sends `request` (never the whole of one) and then nothing."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(request)
    sock.setblocking(False)
    return sock


def dropped(sock: socket.socket) -> bool:
    """Whether the server has closed this connection (after a 408, or without a word)."""
    try:
        while data := sock.recv(65536):
            del data  # nginx may say 408 first
        return True
    except BlockingIOError:
        return False
    except OSError:  # reset
        return True


def test_slow_clients_wait_in_nginx_while_the_service_answers_as_before(proxy, service, smoke_key, session):
    """Half a header line, or a body that stops short, then silence: gunicorn never sees them, so
    its threads keep answering the operator's /healthz and the partners behind nginx; nginx drops
    them at its own timeouts."""
    def answers() -> tuple[int, int, float]:
        started = time.monotonic()
        health = session.get(service.base_url + "/healthz", timeout=5).status_code
        me = get(proxy, ME, bearer(smoke_key))[0]
        return health, me, time.monotonic() - started

    before = answers()
    half_header = b"GET /api/v1/partner/me HTTP/1.1\r\nHost: api.exa"
    short_body = (f"POST {WEBHOOKS} HTTP/1.1\r\nHost: api.example.test\r\nAuthorization: Bearer {smoke_key}\r\n"
                  f"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{\"url\": ").encode()
    slow = [slow_client(proxy, half_header) for _ in range(SLOW_HEADERS)]
    slow += [slow_client(proxy, short_body) for _ in range(SLOW_BODIES)]
    try:
        during = [answers() for _ in range(10)]
        assert [(health, me) for health, me, _ in during] == [before[:2]] * 10 == [(200, 200)] * 10
        assert max(seconds for _, _, seconds in during) < SLACK_SECONDS, during  # held, they would time out
        assert eventually(lambda: all(map(dropped, slow)), seconds=DROPPED_WITHIN_SECONDS, pause=0.5)
    finally:
        for sock in slow:
            sock.close()
    assert answers()[:2] == (200, 200)


def test_the_kit_binds_the_partner_port_where_only_the_proxy_reaches_it(tmp_path):
    """gunicorn.conf.py under the unit's environment listens on loopback only, at the address the
    nginx site forwards to."""
    unit = (DEPLOY / "systemd" / "partner.service").read_text()
    env = dict(re.findall(r"^Environment=(\w+)=(.*)$", unit, re.M))
    settings = subprocess.run([sys.executable, "-c", "import runpy; print(runpy.run_path('gunicorn.conf.py')['bind'])"],
                              cwd=ROOT, env={"PATH": os.environ["PATH"], "PROMETHEUS_MULTIPROC_DIR": str(tmp_path), **env},
                              capture_output=True, text=True, timeout=60)
    assert settings.returncode == 0, settings.stderr
    assert settings.stdout.strip() == "['127.0.0.1:8000']"
    site = (DEPLOY / "nginx" / "partner-site.conf").read_text()
    assert re.findall(r"^\s*server (\S+);", site, re.M) == ["127.0.0.1:8000"]


@pytest.mark.parametrize("path", ["/api/v1/partner/me%0D%0A2026-11-23%2000:00:00%20[WARNING]%20app:%20forged",
                                  "/api/v1/partner/me%1B[2K"])
def test_a_path_with_control_characters_through_the_proxy_leaves_one_clean_access_line(proxy, service, path):
    assert get(proxy, path)[0] == 404

    def access_lines() -> list[str]:
        return [line for line in service.output()[0].splitlines() if "/api/v1/partner/me" in line]
    assert eventually(access_lines)  # the service writes its access line after the answer
    stdout, _ = service.output()
    lines = access_lines()
    assert len(lines) == 1, stdout
    assert not any(ord(ch) < 0x20 or ch == "\x7f" for ch in lines[0]), lines


@pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed (Debian's prometheus package)")
@pytest.mark.parametrize("check, path", [("rules", "alerts.yml"), ("config", "prometheus.yml")])
def test_promtool_accepts_the_prometheus_files(check, path):
    result = subprocess.run([PROMTOOL, "check", check, str(DEPLOY / "prometheus" / path)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_alert_rules_watch_metrics_the_service_exports():
    from partner.telemetry import metrics  # importing it registers every metric
    exported = {name for family in metrics.REGISTRY.collect() for name in (family.name, family.name + "_total")}
    exported |= {"partner_database_up", "partner_deliveries_due", "partner_delivery_oldest_due_seconds",
                 "partner_deliveries_ready", "partner_delivery_oldest_ready_seconds"}
    rules = (DEPLOY / "prometheus" / "alerts.yml").read_text()
    named = set(re.findall(r"\b(partner_[a-z_]+)\b", rules))
    assert len(named) == 5 and named <= exported, named - exported


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_accepts_the_unit(tmp_path):
    """The shipped unit with its code folder pointed at this checkout (verify wants an ExecStart that
    exists): no line systemd would ignore or refuse."""
    unit = tmp_path / "partner.service"
    unit.write_text((DEPLOY / "systemd" / "partner.service").read_text().replace("/opt/partner", str(ROOT)))
    result = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stderr) == (0, ""), result.stderr


def test_the_unit_does_not_restart_a_refused_start():
    """A refusal (gunicorn's exit 4: a bad setting, a database newer than the code) says why once;
    restarting would only say it again every RestartSec."""
    from partner.errors import APP_LOAD_ERROR
    unit = (DEPLOY / "systemd" / "partner.service").read_text()
    assert re.findall(r"^RestartPreventExitStatus=(.*)$", unit, re.M) == [str(APP_LOAD_ERROR)]
    assert re.findall(r"^Restart=(.*)$", unit, re.M) == ["on-failure"]
