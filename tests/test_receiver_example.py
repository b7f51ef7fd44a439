"""Tests for examples/receiver.py, served for real on loopback."""

from __future__ import annotations

import http.client
import importlib.util
import json
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import requests

from signing import signature_headers

ROOT = Path(__file__).resolve().parents[1]
SECRET = "whsec_cmVjZWl2ZXIgZXhhbXBsZSBzZWNyZXQgMzIgYnl0ZXM="  # as issued from release 1.4
OLD_SECRET = "whsec_yMnKy8zNzs_Q0dLT1NXW19jZ2tvc3d7f4OHi4-Tl5uc"  # as issued before: base64url
WRONG_SECRET = "whsec_YSB3cm9uZyBzZWNyZXQsIDMyIGJ5dGVzIGFzIHdlbGw="
# The headers of each scheme; the service sends both, and the receiver verifies X-VC-* if present.
SCHEMES = {"x-vc": ("X-VC-Signature", "X-VC-Timestamp"),
           "standard": ("webhook-id", "webhook-timestamp", "webhook-signature")}


def _load_receiver() -> ModuleType:
    """Import examples/receiver.py, which is a script, not a package module."""
    spec = importlib.util.spec_from_file_location("receiver_example", ROOT / "examples/receiver.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


receiver = _load_receiver()


@pytest.fixture
def base_url() -> Iterator[str]:
    server = receiver.make_server("127.0.0.1", 0, [OLD_SECRET, SECRET])
    # A short poll interval: shutdown() waits for the loop's next poll.
    thread = threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


@pytest.fixture
def session() -> Iterator[requests.Session]:
    with requests.Session() as http:
        http.trust_env = False  # never route loopback through a proxy from the environment
        yield http


def envelope(event_id: str | None = None) -> bytes:
    """A compact vc.test.ping envelope, as the service serializes it."""
    event = {
        "event": "vc.test.ping",
        "id": event_id or f"evt_{uuid.uuid4()}",
        "subscription_id": "wh_test",
        "occurred_at": "2026-11-22T10:15:30.123Z",
        "data": {"message": "ping", "triggered_by_key_id": "key_test"},
    }
    return json.dumps(event, separators=(",", ":")).encode()


def deliver(
    session: requests.Session,
    url: str,
    body: bytes,
    secret: str = SECRET,
    now_ms: int | None = None,
    scheme: str = "x-vc",
) -> requests.Response:
    """POST body with fresh signature headers of one scheme, as one delivery attempt."""
    signed = signature_headers(secret, "evt_test", body, now_ms)
    headers = {"Content-Type": "application/json", **{name: signed[name] for name in SCHEMES[scheme]}}
    return session.post(url, data=body, headers=headers, timeout=5)


def test_a_get_says_it_is_listening(base_url: str, session: requests.Session) -> None:
    response = session.get(base_url)  # what the README's first session waits on
    assert (response.status_code, response.json()) == (200, {"status": "listening"})


@pytest.mark.parametrize("scheme", SCHEMES)
def test_valid_delivery_is_acknowledged(base_url: str, session: requests.Session, scheme: str) -> None:
    response = deliver(session, base_url, envelope(), scheme=scheme)
    assert (response.status_code, response.json()) == (200, {"status": "ok"})


def test_redelivery_of_an_event_is_a_duplicate(base_url: str, session: requests.Session) -> None:
    body = envelope()
    deliver(session, base_url, body)
    response = deliver(session, base_url, body)
    assert (response.status_code, response.json()) == (200, {"status": "duplicate"})


@pytest.mark.parametrize("scheme", SCHEMES)
def test_old_secret_still_verifies_during_rotation(
    base_url: str, session: requests.Session, scheme: str
) -> None:
    assert deliver(session, base_url, envelope(), secret=OLD_SECRET, scheme=scheme).status_code == 200


@pytest.mark.parametrize("scheme", SCHEMES)
def test_wrong_secret_is_unauthorized(base_url: str, session: requests.Session, scheme: str) -> None:
    response = deliver(session, base_url, envelope(), secret=WRONG_SECRET, scheme=scheme)
    assert response.status_code == 401
    assert response.json() == {"error": "invalid_signature", "reason": "signature_mismatch"}


@pytest.mark.parametrize("scheme", SCHEMES)
def test_stale_timestamp_is_unauthorized(base_url: str, session: requests.Session, scheme: str) -> None:
    stale = time.time_ns() // 1_000_000 - 301_000
    response = deliver(session, base_url, envelope(), now_ms=stale, scheme=scheme)
    assert response.status_code == 401
    assert response.json() == {"error": "invalid_signature", "reason": "timestamp_out_of_window"}


def test_unsigned_request_is_unauthorized(base_url: str, session: requests.Session) -> None:
    response = session.post(base_url, data=envelope(), timeout=5)
    assert response.json() == {"error": "invalid_signature", "reason": "missing_header"}


def test_rejected_delivery_is_not_remembered(base_url: str, session: requests.Session) -> None:
    body = envelope()
    deliver(session, base_url, body, secret=WRONG_SECRET)
    assert deliver(session, base_url, body).json() == {"status": "ok"}


def test_verified_non_envelope_is_a_bad_request(base_url: str, session: requests.Session) -> None:
    assert deliver(session, base_url, b"[1, 2]").status_code == 400


def test_oversized_body_is_refused_unread(base_url: str) -> None:
    host, port = base_url.removeprefix("http://").rstrip("/").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=5)
    connection.putrequest("POST", "/")
    connection.putheader("Content-Length", str(receiver.MAX_BODY_BYTES + 1))
    connection.endheaders()
    assert connection.getresponse().status == 413
    connection.close()


def test_verified_event_is_logged_without_the_secret(
    base_url: str, session: requests.Session, capsys: pytest.CaptureFixture[str]
) -> None:
    deliver(session, base_url, envelope("evt_logged"))
    printed = capsys.readouterr().out
    assert "evt_logged vc.test.ping" in printed
    assert SECRET not in printed


@pytest.mark.parametrize("secrets", [[], "", [""]])
def test_server_refuses_to_start_without_a_secret(secrets: object) -> None:
    with pytest.raises(ValueError):
        receiver.make_server("127.0.0.1", 0, secrets)
