"""A platform service publishing events: one at a time, or in batches, each exactly once.

Standard library only. With a publisher credential from `flask publishers create NAME` and a type
registered with `flask event-types add NAME`:

    PUBLISHER_CREDENTIAL=vcp_... python publisher.py acme lead.created '{"lead_id": "ld_1"}'

prints the service's answer. PUBLISH_URL (default http://127.0.0.1:8000) is the port the publish
endpoints answer on (PARTNER_OPS_PORT when the service sets one).

Every request carries an Idempotency-Key, made once per logical publish and sent again unchanged
on every retry: a retry of a publish that did go through gets the first answer back (200,
`Idempotent-Replayed: true`) and queues nothing twice. 429 and 503 (`service_unavailable`,
`backlog_full`) and 409 `idempotency_in_progress` are retried after their Retry-After, with
backoff; a connection that fails is retried too. Every other answer is final: a 4xx means the
request itself is wrong and must be fixed, not repeated.
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.error
import urllib.request
import uuid
from typing import Any

RETRYABLE = {429, 503}
ATTEMPTS = 6
MAX_PAUSE_SECONDS = 60.0


class PublishError(Exception):
    """The service refused the publish; `problem` is its RFC 9457 body."""

    def __init__(self, status: int, problem: dict[str, Any]) -> None:
        super().__init__(f"{status} {problem.get('code')}: {problem.get('detail')}")
        self.status, self.problem = status, problem


class Publisher:
    def __init__(self, credential: str, base_url: str = "http://127.0.0.1:8000", timeout: float = 10.0,
                 sleep=time.sleep) -> None:
        self.credential, self.base_url, self.timeout, self.sleep = credential, base_url.rstrip("/"), timeout, sleep

    def publish(self, organization: str, event: str, data: dict[str, Any], key: str | None = None) -> dict[str, Any]:
        """Publish one event; its answer: `{"id", "event", "organization", "occurred_at", "subscriptions"}`."""
        body = {"organization": organization, "event": event, "data": data}
        return self._post("/internal/v1/events", body, key or str(uuid.uuid4()))

    def publish_batch(self, events: list[dict[str, Any]], key: str | None = None) -> list[dict[str, Any]]:
        """Publish 1 to 500 events (each `{"organization", "event", "data"}`), all or nothing."""
        return self._post("/internal/v1/events/batch", {"events": events}, key or str(uuid.uuid4()))["data"]

    def _post(self, path: str, body: dict[str, Any], key: str) -> dict[str, Any]:
        payload = json.dumps(body).encode()
        for attempt in range(1, ATTEMPTS + 1):
            request = urllib.request.Request(self.base_url + path, data=payload, method="POST", headers={
                "Authorization": f"Bearer {self.credential}", "Content-Type": "application/json",
                "Idempotency-Key": key})
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    return json.load(response)
            except urllib.error.HTTPError as error:
                problem = _problem(error)
                retry = error.code in RETRYABLE or problem.get("code") == "idempotency_in_progress"
                if not retry or attempt == ATTEMPTS:
                    raise PublishError(error.code, problem) from None
                pause = _retry_after(error.headers.get("Retry-After"), attempt)
            except (urllib.error.URLError, TimeoutError, ConnectionError):
                if attempt == ATTEMPTS:
                    raise
                pause = _backoff(attempt)
            self.sleep(pause)
        raise AssertionError("unreachable")


def _problem(error: urllib.error.HTTPError) -> dict[str, Any]:
    try:
        return json.load(error)
    except ValueError:
        return {}


def _retry_after(header: str | None, attempt: int) -> float:
    """The service's Retry-After (seconds), never less than the backoff's floor."""
    try:
        asked = float(header) if header is not None else 0.0
    except ValueError:
        asked = 0.0
    return min(MAX_PAUSE_SECONDS, max(asked, _backoff(attempt)))


def _backoff(attempt: int) -> float:
    return min(MAX_PAUSE_SECONDS, 0.5 * 2 ** (attempt - 1))


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    publisher = Publisher(os.environ["PUBLISHER_CREDENTIAL"], os.environ.get("PUBLISH_URL", "http://127.0.0.1:8000"))
    try:
        answer = publisher.publish(argv[1], argv[2], json.loads(argv[3]))
    except PublishError as error:
        print(json.dumps(error.problem), file=sys.stderr)
        return 1
    print(json.dumps(answer))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
