"""The deployment kit in deploy/, exercised for real: the nginx site's locations in front of a real
gunicorn, and the Prometheus config and alert rules through promtool. Each test skips, saying why,
when its program is not installed (scripts/test-services.sh installs both)."""

import re
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.gunicorn_server import ROOT, Gunicorn
from tests.support import ME, WEBHOOKS, bearer, free_port

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
events {{ worker_connections 64; }}
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
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                pytest.fail(f"nginx did not start: {process.stderr.read().decode()}")
            time.sleep(0.05)
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


@pytest.mark.parametrize("path", ["/api/v1/partner/me%0D%0A2026-11-23%2000:00:00%20[WARNING]%20app:%20forged",
                                  "/api/v1/partner/me%1B[2K"])
def test_a_path_with_control_characters_through_the_proxy_leaves_one_clean_access_line(proxy, service, path):
    assert get(proxy, path)[0] == 404
    time.sleep(0.2)
    stdout, _ = service.output()
    lines = [line for line in stdout.splitlines() if "/api/v1/partner/me" in line]
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
    exported |= {"partner_database_up", "partner_deliveries_due", "partner_delivery_oldest_due_seconds"}
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
