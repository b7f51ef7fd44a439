"""The API described, against a live gunicorn: /docs rendered by headless Chromium, and schemathesis
fuzzing the partner API with a real key, on SQLite and on PostgreSQL, checking every answer against
/openapi.json.

The service is tests/fuzz_wsgi.py: the real app with deliveries off (nothing it queues is ever sent)
and a stub resolver (the fuzzer's invented host names never reach real DNS)."""

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import requests

from partner.edge import apidocs
from tests.gunicorn_server import BIN, ROOT, Gunicorn
from tests.servers import free_port
from tests.support import ENCRYPTION_KEYS, chromium, open_database

SCREENSHOT = ROOT / "docs" / "api-docs.png"
# Bounded fuzzing: examples per operation, a fixed seed (a failure reproduces), a hard time limit.
FUZZ_EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "200"))
FUZZ_SEED = os.environ.get("FUZZ_SEED", "20261122")
FUZZ_SECONDS = 150
FUZZ_CHECKS = "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance"


def live_service(workdir: Path, database_url: str):
    """The fuzz app under the real gunicorn on `database_url`, and a real key issued by the operator CLI."""
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("PARTNER_", "GUNICORN_", "FLASK_"))}
    env.update(PORT=str(free_port()), PYTHONUNBUFFERED="1", PARTNER_SCHEDULER_ENABLED="false",
               PARTNER_DATABASE_URL=database_url, PARTNER_ENCRYPTION_KEYS=json.dumps(ENCRYPTION_KEYS))
    open_database(database_url).close_all()  # as the service's first start makes it: the key comes first
    issued = subprocess.run([BIN / "flask", "keys", "create", "--org", "fuzz", "--scope", "webhooks:manage",
                             "--rate-limit", "100000"],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=30)
    assert issued.returncode == 0, issued.stderr
    server = Gunicorn(env, workdir, app_module="tests.fuzz_wsgi:app")
    with requests.Session() as session:
        session.trust_env = False
        server.wait_until_serving(session)
    server.key = issued.stdout.strip().splitlines()[-1]
    yield server
    assert server.stop() == 0
    assert "Traceback" not in server.output()[1], server.output()[1]


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("live")
    yield from live_service(workdir, f"sqlite:///{workdir}/live.sqlite3")


@pytest.fixture(scope="module")
def postgres_service(tmp_path_factory, postgres_server):
    yield from live_service(tmp_path_factory.mktemp("live-pg"), postgres_server.url(postgres_server.create_schema()))


def test_docs_page_renders_every_endpoint_and_the_webhook(service, tmp_path):
    shown = chromium("--dump-dom", f"{service.base_url}/docs", profile=tmp_path / "profile")
    assert shown.returncode == 0, shown.stderr[-2000:]
    rendered = set(re.findall(r'class="opblock-summary-path" data-path="([^"]+)"', shown.stdout))
    document = apidocs.document()
    assert rendered == set(document["paths"]) | set(document["webhooks"]), shown.stdout[-2000:]
    assert "OAS 3.1" in shown.stdout
    access_log = service.output()[0]
    for asset in ("/docs/assets/swagger-ui-bundle.js", "/docs/assets/swagger-ui.css", "/openapi.json"):
        assert f'"GET {asset} HTTP/1.1" 200' in access_log, asset


def test_docs_page_screenshot(service, tmp_path):
    """Takes the page's picture; UPDATE_SCREENSHOT=1 stores it as docs/api-docs.png (shown in docs/decisions.md)."""
    target = SCREENSHOT if os.environ.get("UPDATE_SCREENSHOT") else tmp_path / "api-docs.png"
    shot = chromium("--window-size=1280,1300", f"--screenshot={target}", f"{service.base_url}/docs",
                    profile=tmp_path / "profile")
    assert shot.returncode == 0, shot.stderr[-2000:]
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert target.stat().st_size > 50_000  # a rendered page, not a blank one


@pytest.mark.both_databases
def test_schemathesis_finds_no_server_error_and_no_answer_outside_the_document(backend, request, tmp_path):
    service = request.getfixturevalue("service" if backend == "sqlite" else "postgres_service")
    run = subprocess.run(
        [BIN / "schemathesis", "run", f"{service.base_url}/openapi.json",
         "--header", f"Authorization: Bearer {service.key}", "--checks", FUZZ_CHECKS,
         "--max-examples", str(FUZZ_EXAMPLES), "--seed", FUZZ_SEED, "--workers", "2", "--no-color"],
        cwd=tmp_path, capture_output=True, text=True, timeout=FUZZ_SECONDS)
    print(run.stdout if os.environ.get("FUZZ_VERBOSE") else run.stdout.splitlines()[-1:])
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    assert "generated" in run.stdout and "No issues found" in run.stdout, run.stdout[-3000:]
