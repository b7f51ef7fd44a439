"""The publish endpoints (CONTRACT §11): `POST /internal/v1/events` and `/events/batch`, for the
platform's services, authenticated by a publisher credential (`vcp_…`), never a partner key, and never
charged to an organization's rate limit. With PARTNER_OPS_PORT set they answer on that port only
(edge/ops_port.py). Thin: parse, call partner/publishing.py, shape."""

import threading

from flask import Blueprint, Flask, current_app, g, request

from partner import publishers
from partner.edge.json_body import read_json_object
from partner.errors import ApiError, ValidationError, field_error
from partner.publishing import MAX_BATCH, MAX_EVENT_BYTES, publish_once
from partner.timestamps import now_ms

MAX_BATCH_BYTES = 5 * 1024 * 1024
# Publishes answered at once by one process. Without PARTNER_OPS_PORT they share the partner port's
# request threads (8 a worker), and a batch may hold SQLite's writer for half a second: more at once
# adds no throughput (one writer), only takes threads the partner API and the probes need. Beyond, 503
# with Retry-After: 1 (examples/publisher.py waits and sends it again).
PUBLISHES_AT_ONCE = 2
UNAUTHORIZED_DETAIL = "A valid publisher credential is required, sent as 'Authorization: Bearer vcp_...'."

internal = Blueprint("internal", __name__, url_prefix="/internal/v1")


def install_publishing(app: Flask) -> None:
    app.extensions["publishing_slots"] = threading.BoundedSemaphore(PUBLISHES_AT_ONCE)
    app.register_blueprint(internal)


@internal.before_request
def _authenticate() -> None:
    g.publisher = publishers.authenticate_publisher(request.headers.get("Authorization"))
    if g.publisher is None:
        current_app.extensions["rate_limits"].charge_failed_login(request.remote_addr)
        raise ApiError(401, "unauthorized", UNAUTHORIZED_DETAIL,
                       headers={"WWW-Authenticate": 'Bearer realm="publish"'})


@internal.post("/events")
def publish_one():
    request.max_content_length = MAX_EVENT_BYTES
    body = read_json_object()
    return _answer(body, [body], "", lambda accepted: accepted[0].json())


@internal.post("/events/batch")
def publish_batch():
    request.max_content_length = MAX_BATCH_BYTES
    body = read_json_object()
    return _answer(body, batch_events(body), "events/", lambda accepted: {"data": [item.json() for item in accepted]})


def _answer(body: dict, items: list, prefix: str, shape):
    """202 with the answer, or 200 with the first answer to the same Idempotency-Key again."""
    slots = current_app.extensions["publishing_slots"]
    if not slots.acquire(blocking=False):
        raise ApiError(503, "service_unavailable", f"{PUBLISHES_AT_ONCE} publishes are being answered by this process; "
                       "send it again in a moment.", headers={"Retry-After": "1"})
    try:
        answer, replayed = publish_once(g.publisher.id, request.headers.get("Idempotency-Key"), body, items, prefix,
                                        now_ms(current_app.config["CLOCK"]), current_app.config["BACKLOG_LIMIT"], shape)
    finally:
        slots.release()
    if not replayed:
        current_app.extensions["delivery"].wake()
    return current_app.response_class(answer, 200 if replayed else 202,
                                      {"Idempotent-Replayed": "true"} if replayed else {}, mimetype="application/json")


def batch_events(body: dict) -> list:
    """A batch body's `events`: 1 to MAX_BATCH of them, and no other field, or 422."""
    events = body.get("events")
    errors = [field_error(name, "unknown_field", "This field is not accepted.") for name in body if name != "events"]
    if not isinstance(events, list) or not 1 <= len(events) <= MAX_BATCH:
        code = "required" if events is None else "out_of_range" if isinstance(events, list) else "invalid_type"
        errors.append(field_error("events", code, f"A list of 1 to {MAX_BATCH} events."))
    if errors:
        raise ValidationError(errors)
    return events
