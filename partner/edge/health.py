"""The operator's endpoints: liveness, readiness and the Prometheus scrape.

They need no API key, are never rate limited, never write, and open no pooled connection: the
database is read only through backlog.read_backlog, which is bounded in time, so none of them can
hang or load the database with commits. That read also asks whether a write could begin, writing
nothing: a write lock another process holds makes /readyz not ready, and during an outage a probe that
goes through ends it (availability.probe_answered).
"""

import threading
import time

from flask import Blueprint, Flask, current_app, g, request
from flask.globals import request_ctx
from werkzeug.exceptions import HTTPException, MethodNotAllowed

from partner.telemetry import metrics
from partner.store.availability import database_outage, probe_answered
from partner.store.backlog import DatabaseUnavailable, read_backlog
from partner.errors import ApiError
from partner.timestamps import now_ms

READY_TIMEOUT_SECONDS = 2.0

health = Blueprint("health", __name__)


def install_health(app: Flask) -> None:
    """Serve the ops endpoints and count every request of the app in the metrics."""
    app.register_blueprint(health)
    app.before_request(_start_timer)
    app.after_request(_count_request)


@health.get("/healthz")
def healthz():
    return {"status": "ok"}


@health.get("/readyz")
def readyz():
    now = now_ms(current_app.config["CLOCK"])
    try:
        backlog = _backlog(now)
    except DatabaseUnavailable as error:
        raise ApiError(503, "not_ready", f"database: {error}.") from None
    # Whether writes commit is learned from the service's own writes (a 503, the scanner's claims)
    # and from a probe that writes nothing (_read_backlog); never from a commit here: a probe that
    # commits would let anyone load the database with GETs.
    refusal = database_outage.failure
    if refusal:
        raise ApiError(503, "not_ready", f"database: the database cannot take a write ({refusal}).")
    if backlog.writable is False:
        raise ApiError(503, "not_ready", "database: another process holds the database's write lock "
                                         "(writes wait for it).")
    return {"status": "ready", "database": "ok",
            "scheduler": current_app.extensions["delivery"].scheduler_state(),
            "deliveries_due": backlog.due, "oldest_due_seconds": backlog.oldest_due_seconds(now)}


@health.get("/metrics")
def scrape():
    body, content_type = _recent_scrape.get(_render_scrape)
    return body, 200, {"Content-Type": content_type}


def _render_scrape() -> tuple[bytes, str]:
    now = now_ms(current_app.config["CLOCK"])
    try:
        backlog = _backlog(now)
    except DatabaseUnavailable:
        backlog = None
    return metrics.exposition(backlog, now)


class Recent:
    """A value computed at most once every `seconds`, by one thread at a time; the others get the
    last one. Summing every worker's metric files costs milliseconds, and reading the backlog during
    an outage up to its time bound: without this, a hammer on /metrics or /readyz would cost the
    partner API what the scrapes cost, and hold a thread each. A failure (an exception) is kept as
    long as a value. The computation runs outside the lock: a thread that finds one under way takes
    the last outcome, or, when there is none yet, waits for that computation's."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self._lock = threading.Lock()
        self._outcome: tuple | None = None  # (value, exception)
        self._computed_at = float("-inf")
        self._computing: threading.Event | None = None

    def get(self, compute):
        with self._lock:
            computing = self._computing
            due = computing is None and time.monotonic() - self._computed_at >= self.seconds
            if due:
                computing = self._computing = threading.Event()
        if due:
            try:
                outcome = (compute(), None)
            except Exception as error:  # noqa: BLE001 - kept, and raised to every caller until stale
                outcome = (None, error)
            with self._lock:
                self._outcome, self._computed_at, self._computing = outcome, time.monotonic(), None
            computing.set()
        elif computing is not None and self._outcome is None:
            computing.wait()
        value, error = self._outcome
        if error is not None:
            raise error.with_traceback(None)  # the same one for every caller: no traceback piles up
        return value


def _backlog(now: int):
    """The due backlog (a probe or a scrape asks every few seconds; a hammer of them must not open
    a connection each)."""
    most = current_app.config["DELIVERY_MAX_PER_SUBSCRIPTION"]
    return _recent_backlog.get(lambda: _read_backlog(now, most))


def _read_backlog(now: int, most: int):
    """The due backlog and the write probe, within READY_TIMEOUT_SECONDS; a probe that went through
    ends an outage."""
    backlog = read_backlog(now, READY_TIMEOUT_SECONDS, most)
    if backlog.writable:
        probe_answered()
    return backlog


# Under gunicorn (metrics summed over workers), a scrape and the backlog are at most a second old;
# in a single process (the tests) every request reads them afresh.
_FRESHNESS_SECONDS = 1.0 if metrics.SHARED else 0.0
_recent_scrape, _recent_backlog = Recent(_FRESHNESS_SECONDS), Recent(_FRESHNESS_SECONDS)


def _start_timer() -> None:
    g.started_at = time.perf_counter()


def _count_request(response):
    started_at = g.get("started_at")
    if started_at is not None:
        metrics.count_request(request.method, _route(), response.status_code, time.perf_counter() - started_at)
    return response


def _route() -> str | None:
    """The URL rule the request matched; for a 405, the rule its path matches with another method
    (the route exists, the method does not); None for a path no rule matches."""
    if request.url_rule is not None:
        return request.url_rule.rule
    refusal = request.routing_exception
    if not isinstance(refusal, MethodNotAllowed) or not refusal.valid_methods:
        return None
    try:  # matched again only for a 405, with a method the rule takes
        rule, _ = request_ctx.url_adapter.match(method=refusal.valid_methods[0], return_rule=True)
    except HTTPException:
        return None
    return rule.rule
