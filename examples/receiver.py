"""A minimal webhook receiver: verify the signature, de-duplicate by event id, answer.

It verifies X-VC-Signature when the request has one, else the Standard Webhooks headers
(webhook-id, webhook-timestamp, webhook-signature): the service sends both.

Standard library only. Copy this file and signing.py into one directory, then:

    WEBHOOK_SECRETS="whsec_new whsec_old" python receiver.py

WEBHOOK_SECRETS is space-separated so that two secrets work during a rotation.
HOST (default 127.0.0.1) and PORT (default 9000) choose where to listen.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections import OrderedDict
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

try:
    import signing  # a partner copies signing.py beside this file
except ImportError:  # inside the service's repo, signing.py sits one level up
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import signing

MAX_BODY_BYTES = 1024 * 1024
# Redeliveries of one event span about 33 hours; a real receiver keeps ids that
# long in its database (a unique key), not in a bounded in-memory set.
REMEMBERED_EVENTS = 10_000


class SeenEvents:
    """A bounded, thread-safe record of the event ids already handled."""

    def __init__(self, limit: int) -> None:
        self._ids: OrderedDict[str, None] = OrderedDict()
        self._limit = limit
        self._lock = threading.Lock()

    def add(self, event_id: str) -> bool:
        """Remember event_id; False if it was already there."""
        with self._lock:
            if event_id in self._ids:
                self._ids.move_to_end(event_id)
                return False
            self._ids[event_id] = None
            if len(self._ids) > self._limit:
                self._ids.popitem(last=False)
            return True


class ReceiverServer(ThreadingHTTPServer):
    """An HTTP server that carries the receiver's secrets and its memory of events."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], secrets: tuple[str, ...]) -> None:
        super().__init__(address, WebhookHandler)
        self.secrets = secrets
        self.seen = SeenEvents(REMEMBERED_EVENTS)


class WebhookHandler(BaseHTTPRequestHandler):
    """Answers each POST: 401 unless verified, then 200 "ok" or "duplicate"; a GET
    answers 200 "listening", for a health check or a script waiting for it."""

    server: ReceiverServer
    timeout = 10  # seconds per socket read, so a stalled client frees its thread

    def do_GET(self) -> None:
        self._reply(200, {"status": "listening"})

    def do_POST(self) -> None:
        """Verify one delivery and acknowledge it."""
        body = self._read_body()
        if body is None:
            return
        verify = signing.verify if signing.SIGNATURE_HEADER in self.headers else signing.verify_standard
        try:
            # self.headers is an email Message, not a typing.Mapping; verify only
            # needs items(), and this way a repeated header stays visible to it.
            verified = verify(self.headers, body, self.server.secrets)  # type: ignore[arg-type]
        except signing.SignatureError as error:
            self._reply(401, {"error": "invalid_signature", "reason": error.reason})
            return
        event = _parse_envelope(verified)
        if event is None:
            self._reply(400, {"error": "invalid_envelope"})
        elif not self.server.seen.add(event["id"]):
            self._reply(200, {"status": "duplicate"})
        else:
            # Handle the event here; if handling fails, answer 5xx and forget the
            # id so the service's retry is processed. Never print the secret.
            print(f"verified {event['id']} {event.get('event')}", flush=True)
            self._reply(200, {"status": "ok"})

    def _read_body(self) -> bytes | None:
        """The raw body, or None after answering 411 / 400 / 413."""
        length = self.headers.get("Content-Length")
        if length is None:
            self._reply(411, {"error": "length_required"})
        elif not (length.isascii() and length.isdigit()):
            self._reply(400, {"error": "bad_content_length"})
        elif int(length) > MAX_BODY_BYTES:
            self._reply(413, {"error": "payload_too_large"})
        else:
            # Verify the exact bytes received: never re-serialize before verifying.
            return self.rfile.read(int(length))
        return None

    def _reply(self, status: int, payload: dict[str, str]) -> None:
        """Send a short JSON answer and close the connection."""
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def _parse_envelope(body: bytes) -> dict[str, Any] | None:
    """The event envelope, or None unless it is a JSON object with a string id."""
    try:
        event = json.loads(body)
    except ValueError:
        return None
    if not isinstance(event, dict) or not isinstance(event.get("id"), str):
        return None
    return event


def make_server(host: str, port: int, secrets: str | Iterable[str]) -> ThreadingHTTPServer:
    """A receiver bound to host:port (port 0 picks a free one); call serve_forever()."""
    candidates = (secrets,) if isinstance(secrets, str) else tuple(secrets)
    if not any(candidates):
        raise ValueError("at least one webhook secret is required")
    return ReceiverServer((host, port), candidates)


def main() -> None:
    """Serve until interrupted, configured from the environment."""
    secrets = os.environ.get("WEBHOOK_SECRETS", "").split()
    if not secrets:
        sys.exit("set WEBHOOK_SECRETS to the subscription secret (space-separate two to rotate)")
    host = os.environ.get("HOST", "127.0.0.1")
    port = int(os.environ.get("PORT", "9000"))
    server = make_server(host, port, secrets)
    print(f"listening on http://{host}:{server.server_address[1]}/", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
