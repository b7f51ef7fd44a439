"""Every error rendered as RFC 9457 problem+json: the handlers, and the 503s of a database outage, of
a secret this process cannot open, and of a DNS lookup that cannot start."""

import logging
from http import HTTPStatus

from flask import Flask, Response, current_app, json, request
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from partner.store.availability import database_failed, is_unavailable
from partner.errors import ApiError
from partner.outbound.dns import LookupsBusy
from partner.sealing import SealingError

log = logging.getLogger(__name__)

PROBLEM_JSON = "application/problem+json"
# The contract's `code` for errors raised by Flask/Werkzeug rather than by us.
HTTP_CODES = {
    400: "invalid_json",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    413: "payload_too_large",
    429: "rate_limited",
}

# Seconds a client is asked to wait when the database cannot answer: a lock or a restart is usually
# over by then, and it spaces out retries while an outage lasts.
RETRY_AFTER_SECONDS = 5


def problem(status: int, code: str, detail: str, errors: list[dict] | None = None,
            response: Response | None = None) -> Response:
    """Render an RFC 9457 problem; reuse `response` so headers like Allow survive."""
    body = {"type": "about:blank", "title": HTTPStatus(status).phrase,
            "status": status, "detail": detail, "code": code}
    if errors is not None:
        body["errors"] = errors
    response = response or Response()
    response.status_code = status
    response.set_data(json.dumps(body))
    response.content_type = PROBLEM_JSON
    return response


def register_error_handlers(app: Flask) -> None:
    app.register_error_handler(ApiError, _api_error)
    app.register_error_handler(HTTPException, _http_error)
    app.register_error_handler(SealingError, _secret_unreadable)
    app.register_error_handler(LookupsBusy, _lookups_busy)
    app.register_error_handler(Exception, _unexpected_error)


def _api_error(error: ApiError) -> Response:
    response = problem(error.status, error.code, error.detail, error.errors)
    response.headers.update(error.headers)
    return response


def _http_error(error: HTTPException) -> Response:
    status = error.code or 500
    code = HTTP_CODES.get(status, "http_error")
    return problem(status, code, _detail(error), response=error.get_response())


def _detail(error: HTTPException) -> str:
    if isinstance(error, RequestEntityTooLarge):  # Werkzeug's words name no size
        limit = byte_size(request.max_content_length or current_app.config["MAX_CONTENT_LENGTH"])
        return f"The request body is over {limit}, the most this API accepts."
    return error.description or HTTPStatus(error.code or 500).phrase


def byte_size(count: int) -> str:
    """`65536` as `64 KiB`, as nginx's own 413 says it; a size that is no whole KiB in bytes."""
    return f"{count // 1024} KiB" if count % 1024 == 0 else f"{count} bytes"


def _unexpected_error(error: Exception) -> Response:
    if is_unavailable(error):
        return _storage_unavailable(error)
    # The traceback goes to the server log only; the partner gets a bare 500.
    log.error("unhandled %s", type(error).__name__, exc_info=error)
    return problem(500, "internal_error", "An unexpected error occurred.")


def _secret_unreadable(error: SealingError) -> Response:
    """503: a webhook secret this process cannot open. Usually it is sealed under a key this process
    lacks: another process's, while keys are rotated one restart at a time (docs/data.md), and
    another process, or this one restarted with the key, can open it. A secret damaged at rest opens
    nowhere: then the log line (naming the key id) is the operator's to act on. Either way the
    request changed nothing, and no input of the partner's caused it: not a 500."""
    log.error("request not served: %s", error)
    return _retry_later(problem(503, "service_unavailable",
                                "This server cannot open the subscription's stored secret right now (as while "
                                "encryption keys are being changed); nothing was changed. Retry later."))


def _lookups_busy(error: LookupsBusy) -> Response:
    """503: the URL's host could not even be looked up now, as other lookups hold what a lookup needs
    (partner/outbound/dns.py). The URL was not judged, so this is no invalid_url; nothing changed."""
    log.info("request not served: DNS lookup not started (%s)", error)
    return _retry_later(problem(503, "service_unavailable",
                                "The service cannot look up the URL's host right now: too many lookups are "
                                "under way. Nothing was changed. Retry later."))


def _storage_unavailable(error: Exception) -> Response:
    """503: the database cannot answer or write now, or rolled this request's transaction back to end
    a deadlock with another. Either way nothing changed, and the request may be made again."""
    database_failed(error)
    return _retry_later(problem(503, "service_unavailable",
                                "The service's database could not complete the request right now; nothing was "
                                "changed. Retry later."))


def _retry_later(response: Response) -> Response:
    response.headers["Retry-After"] = str(RETRY_AFTER_SECONDS)
    return response
