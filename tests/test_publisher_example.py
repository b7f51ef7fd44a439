"""examples/publisher.py's retries, against a scripted HTTP server on 127.0.0.1: 429, 503 and 409
idempotency_in_progress are sent again after Retry-After with the same Idempotency-Key; other refusals
are final. (tests/test_publish_live.py runs it against the real service.)"""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from examples import publisher
from examples.publisher import Publisher, PublishError


@pytest.fixture
def scripted():
    """scripted(answers): a server answering each POST with the next (status, body) and recording
    each request's headers; its base URL."""
    seen, servers = [], []

    def start(answers: list[tuple[int, dict]]) -> str:
        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers["Content-Length"]))
                seen.append(dict(self.headers))
                status, body = answers[min(len(seen), len(answers)) - 1]
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Retry-After", "0")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass
        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        # shutdown() waits out one poll: 0.5 s by default, per test
        threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_port}"
    start.seen = seen
    yield start
    for server in servers:
        server.shutdown()


ACCEPTED = (202, {"id": "evt_1", "event": "lead.created", "organization": "acme", "occurred_at": "x", "subscriptions": 1})


@pytest.mark.parametrize("refusal", [(503, {"code": "backlog_full"}), (429, {"code": "rate_limited"}),
                                     (409, {"code": "idempotency_in_progress"}), (503, {"code": "service_unavailable"})])
def test_a_passing_refusal_is_retried_with_the_same_key(scripted, refusal):
    base, pauses = scripted([refusal, refusal, ACCEPTED]), []
    assert Publisher("vcp_x.y", base, sleep=pauses.append).publish("acme", "lead.created", {}) == ACCEPTED[1]
    keys = [headers["Idempotency-Key"] for headers in scripted.seen]
    assert len(keys) == 3 and len(set(keys)) == 1
    assert pauses == [0.5, 1.0]  # Retry-After 0, so the backoff's floor


@pytest.mark.parametrize("refusal", [(422, {"code": "validation_error"}), (409, {"code": "idempotency_conflict"}),
                                     (401, {"code": "unauthorized"})])
def test_a_refusal_of_the_request_itself_is_final(scripted, refusal):
    base = scripted([refusal, ACCEPTED])
    with pytest.raises(PublishError) as refused:
        Publisher("vcp_x.y", base, sleep=pytest.fail).publish("acme", "lead.created", {})
    assert (refused.value.status, refused.value.problem, len(scripted.seen)) == (refusal[0], refusal[1], 1)


def test_retry_after_is_honoured_up_to_a_minute():
    assert publisher._retry_after("5", 1) == 5 and publisher._retry_after("3600", 1) == 60
    assert publisher._retry_after("soon", 1) == publisher._backoff(1)
