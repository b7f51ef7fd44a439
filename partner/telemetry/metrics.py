"""The Prometheus metrics (docs/operations.md) and their exposition.

Under gunicorn, gunicorn.conf.py points PROMETHEUS_MULTIPROC_DIR at a directory before any worker
imports prometheus_client: each worker then writes its counts to files there and a scrape, whichever
worker answers it, sums them all. Without it (tests, `flask` commands) counts live in this process.
Label values come from small fixed sets: never an organization, a subscription id or a URL.
"""

import os

from prometheus_client import (CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, Counter, Histogram,
                               disable_created_metrics, generate_latest, multiprocess)
from prometheus_client.core import GaugeMetricFamily


disable_created_metrics()  # the `_created` twin of every series only doubles the scrape
# Whether counts live in files every worker writes (under gunicorn), decided at import, as
# prometheus_client itself decides it.
SHARED = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))

HTTP_REQUESTS = Counter("partner_http_requests_total", "HTTP requests answered.",
                        ["method", "route", "status"])
HTTP_DURATION = Histogram("partner_http_request_duration_seconds", "Time to answer an HTTP request.",
                          ["route"])
DELIVERY_ATTEMPTS = Counter("partner_delivery_attempts_total", "Delivery attempts made, by outcome.",
                            ["event", "outcome"])
# Up to the default 10 s deadline and a little past it (a deadline is met, not undercut).
ATTEMPT_DURATION = Histogram("partner_delivery_attempt_duration_seconds", "Duration of one attempt.",
                             ["outcome"],
                             buckets=(.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 15, 30, 60))
DEAD_LETTERED = Counter("partner_deliveries_dead_lettered_total",
                        "Deliveries dead-lettered (attempts exhausted or subscription auto-disabled).")
AUTO_DISABLED = Counter("partner_subscriptions_auto_disabled_total",
                        "Subscriptions auto-disabled after consecutive failures.")
RATE_LIMITED = Counter("partner_rate_limited_total", "Requests refused with 429.", ["kind"])
EVENTS_PUBLISHED = Counter("partner_events_published_total", "Events accepted from publishers, by type.", ["event"])
EVENT_FANOUT = Histogram("partner_event_fanout", "Subscriptions each published event was queued to.",
                         buckets=(0, 1, 2, 5, 10, 25, 50, 100))
DELIVERY_LAG = Histogram("partner_delivery_lag_seconds",
                         "From an event's acceptance to the start of its first attempt, per delivery.",
                         buckets=(.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300))

UNMATCHED_ROUTE = "unmatched"  # every path that matches no route: its text would be unbounded
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


# Each request's pair of series, by their labels: `labels()` takes a lock and builds the
# label tuple on every call, which every request paid. Bounded: methods, rules and statuses are few.
_REQUEST_SERIES: dict[tuple, tuple] = {}


def count_request(method: str, rule: str | None, status: int, seconds: float) -> None:
    """Count one answered request under its URL rule (`/webhooks/<subscription_id>`, not the path)."""
    labels = (method if method in _METHODS else "other", rule or UNMATCHED_ROUTE, status)
    series = _REQUEST_SERIES.get(labels)
    if series is None:  # the first such request: two threads may both get here, to the same series
        series = _REQUEST_SERIES[labels] = (HTTP_REQUESTS.labels(labels[0], labels[1], str(status)),
                                            HTTP_DURATION.labels(labels[1]))
    series[0].inc()
    series[1].observe(seconds)


# Series known before they happen, created at zero when a worker starts (create_known_series):
# prometheus_client exports a labelled series only from its first increment, so rate() over a
# restart would miss the first burst of 429s, timeouts or 5xx.
KNOWN_RATE_LIMITS = ("organization", "failed_auth")
KNOWN_OUTCOMES = ("delivered", "http_status", "timeout", "connection_error", "tls_error", "internal_url", "redirect",
                  "not_recorded")


def create_known_series(events: tuple[str, ...] = ("vc.test.ping",)) -> None:
    """Every series of a known label value, at zero. In each serving process, at its start."""
    for kind in KNOWN_RATE_LIMITS:
        RATE_LIMITED.labels(kind)
    for outcome in KNOWN_OUTCOMES:
        ATTEMPT_DURATION.labels(outcome)
        for event in events:
            DELIVERY_ATTEMPTS.labels(event, outcome)


def count_attempt(event: str, outcome: str, seconds: float) -> None:
    DELIVERY_ATTEMPTS.labels(event, outcome).inc()
    ATTEMPT_DURATION.labels(outcome).observe(seconds)


def observe_lag(claim, attempted_at: int) -> None:
    """The lag from an event's acceptance to its delivery's first attempt (outbox.Claim); a replayed
    dead letter's first attempt again counts from the event's acceptance."""
    if claim.attempt == 1:
        DELIVERY_LAG.observe(max(0, attempted_at - claim.queued_at) / 1000)


def count_published(accepted) -> None:
    """Count published events (publishing.Accepted) and their fan-out."""
    for item in accepted:
        EVENTS_PUBLISHED.labels(item.event.kind).inc()
        EVENT_FANOUT.observe(item.subscriptions)


def exposition(backlog, now_ms: int) -> tuple[bytes, str]:
    """The scrape body and its content type: every process's counters, then the backlog gauges
    read from the database just now (left out when it did not answer: partner_database_up is 0)."""
    return generate_latest(_counters()) + generate_latest(_gauges(backlog, now_ms)), CONTENT_TYPE_LATEST


def _counters():
    if not SHARED:
        return REGISTRY
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    return registry


class _Gauges:
    def __init__(self, backlog, now_ms: int):
        self.backlog, self.now_ms = backlog, now_ms

    def collect(self):
        yield GaugeMetricFamily("partner_database_up", "1 when the database answered this scrape.",
                                value=int(self.backlog is not None))
        if self.backlog is None:
            return
        yield GaugeMetricFamily("partner_deliveries_due", "Deliveries due now and not in flight.",
                                value=self.backlog.due)
        yield GaugeMetricFamily("partner_delivery_oldest_due_seconds",
                                "Age of the oldest due delivery (0 when none is due).",
                                value=self.backlog.oldest_due_seconds(self.now_ms))
        yield GaugeMetricFamily("partner_deliveries_ready",
                                "Due deliveries of subscriptions no receiver holds (for a Retry-After or a failure's "
                                "backoff): the work the service owes now.", value=self.backlog.ready)
        yield GaugeMetricFamily("partner_delivery_oldest_ready_seconds",
                                "Age of the oldest due delivery no receiver holds (0 when none): alert on this one.",
                                value=self.backlog.oldest_ready_seconds(self.now_ms))
        limited = GaugeMetricFamily("partner_subscriptions_limited",
                                    "Subscriptions whose due deliveries wait: held at their limit of attempts "
                                    "in flight (at_limit), or for a Retry-After (paused).", labels=["reason"])
        limited.add_metric(["at_limit"], self.backlog.at_limit)
        limited.add_metric(["paused"], self.backlog.paused)
        yield limited


def _gauges(backlog, now_ms: int) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Gauges(backlog, now_ms))
    return registry
