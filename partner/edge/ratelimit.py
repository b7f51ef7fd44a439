"""Rate limits: a moving 60-second window per organization, and per client address for failed logins.

With `RATELIMIT_STORAGE_URI=redis://…` the windows are `limits`' moving-window strategy on its Redis
storage, shared by every process; with `memory://` (one process) LocalWindows keeps the same exact
windows. LocalWindows counts on the service's clock (config CLOCK), so tests step a window instead of
waiting it out; `limits` times Redis's windows on the real clock, so the headers then are too.

`limits` is flask-limiter's engine, used here without a flask-limiter `Limiter`, which cannot keep
this budget:
- it parses limits from strings, and `limits` keys a window by the parsed amount, so a limit lowered
  by `flask orgs set-limit` would open an empty window (Budget's key leaves the amount out);
- on a failing storage it waits out the socket timeout on every request, or counts in each process
  apart (its in-memory fallback), where StorageProbe serves without a limit and asks once a second;
- it charges a limit before the view, or, after authentication, as a context manager that finds its
  limit by the caller's stack frame, while its request hooks run on every request (~30 µs);
- its headers put `Retry-After` on every response.
So each request is charged here, after authentication, to the key's organization, and the headers
and the problem+json 429 are ours (CONTRACT §3).
"""

import logging
import math
import threading
import time
from collections import deque
from dataclasses import dataclass

from flask import Flask
from limits import RateLimitItemPerMinute
from limits.storage import storage_from_string
from limits.strategies import MovingWindowRateLimiter

from partner.errors import ApiError
from partner.telemetry.metrics import RATE_LIMITED
from partner.store.availability import Outage

log = logging.getLogger(__name__)

WINDOW_SECONDS = 60
# While the storage is failing, requests skip it and only one probe a second waits for it, so a
# frozen Redis costs each request nothing, rather than a socket timeout each.
PROBE_INTERVAL_SECONDS = 1.0


@dataclass(frozen=True)
class Window:
    """The state of one budget right after a request was charged to it."""
    limit: int
    remaining: int
    reset_at: float  # Unix seconds at which the next request would be allowed, if none were left
    allowed: bool
    now: float  # when it was charged, on the clock that timed the window

    def seconds_to_reset(self) -> int:
        return max(1, math.ceil(self.reset_at - self.now))

    def headers(self) -> dict[str, str]:
        """The X-RateLimit-* set and the IETF draft RateLimit / RateLimit-Policy pair."""
        seconds = self.seconds_to_reset()
        headers = {
            "X-RateLimit-Limit": str(self.limit),
            "X-RateLimit-Remaining": str(self.remaining),
            "X-RateLimit-Reset": str(math.ceil(self.reset_at)),
            "RateLimit-Policy": f'"org";q={self.limit};w={WINDOW_SECONDS}',
            "RateLimit": f'"org";r={self.remaining};t={seconds}',
        }
        if not self.allowed:
            headers["Retry-After"] = str(seconds)
        return headers


class LocalWindows:
    """Exact moving windows kept in this process, for `memory://`: each budget's hit times, oldest
    first. limits' own memory storage inserts at the head of a list (O(n) per hit) and starts a
    thread every 10 ms to expire entries, which made the rate limit a third of a request's CPU."""

    def __init__(self, clock):
        self._clock = clock
        self._hits: dict[tuple[str, str], deque[float]] = {}
        self._lock = threading.Lock()
        self._swept_at = clock()

    def hit(self, scope: str, key: str, limit: int) -> Window:
        now = self._clock()
        with self._lock:
            if now - self._swept_at > WINDOW_SECONDS:
                self._sweep(now)
            hits = self._hits.setdefault((scope, key), deque())
            _expire(hits, now)
            allowed = len(hits) < limit
            if allowed:
                hits.append(now)
            reset_at = _reset_at(hits, limit, now)
        # A limit lowered mid-window may already be exceeded: none remain, never fewer.
        return Window(limit, max(0, limit - len(hits)), reset_at, allowed, now)

    def _sweep(self, now: float) -> None:
        """Forget budgets idle for a whole window, so memory follows the active clients only."""
        for budget, hits in list(self._hits.items()):
            _expire(hits, now)
            if not hits:
                del self._hits[budget]
        self._swept_at = now


def _reset_at(hits: deque, limit: int, now: float) -> float:
    """When a request would next be allowed if the budget were spent: once all but `limit - 1` of the
    counted hits have left the window. After a lowered limit more than `limit` are counted, and the
    oldest one leaving frees nothing yet."""
    if not hits:
        return now + WINDOW_SECONDS
    return hits[max(0, len(hits) - limit)] + WINDOW_SECONDS


def _expire(hits: deque, now: float) -> None:
    while hits and hits[0] <= now - WINDOW_SECONDS:
        hits.popleft()


def storage_options(uri: str, timeout: float) -> dict:
    """Socket timeouts for a Redis storage: without them a Redis that stops answering (SIGSTOP, a
    network partition) blocks every request thread for as long as it is stuck. Options in the URL
    (`?socket_timeout=...`) still win."""
    if not uri.startswith(("redis", "valkey")):
        return {}
    return {"socket_timeout": timeout, "socket_connect_timeout": timeout}


class Budget(RateLimitItemPerMinute):
    """A per-minute limit whose storage key leaves the limit out. limits keys a window by its amount,
    so a limit the operator lowers (`flask orgs set-limit`) would open an empty window and forget what
    the organization spent this minute. (One raised again within the minute forgets the hits its
    lowered window trimmed: the error is on the partner's side, and lasts a minute.)"""

    def key_for(self, *identifiers: str) -> str:
        return "/".join([self.namespace, *identifiers, "per-minute"])


class StorageProbe:
    """While the storage is failing, requests skip it and only one per PROBE_INTERVAL_SECONDS asks
    it again, so a frozen Redis costs each request nothing rather than a socket timeout each."""

    def __init__(self, clock):
        self.outage = Outage(log, "rate-limit storage", "serving without a limit", each_failure=False)
        self._clock = clock
        self._lock = threading.Lock()
        self._probe_at = 0.0

    def should_skip(self) -> bool:
        """Whether to serve this request without asking the storage (an outage, between probes)."""
        if not self.outage.active:
            return False
        with self._lock:
            now = self._clock()
            # Wall-clock time: one set back must not put the next probe off by as much.
            if 0 < self._probe_at - now <= PROBE_INTERVAL_SECONDS:
                return True
            self._probe_at = now + PROBE_INTERVAL_SECONDS
            return False

    def failed(self, error: Exception) -> None:
        with self._lock:
            self._probe_at = self._clock() + PROBE_INTERVAL_SECONDS
        self.outage.failed(error)


class RateLimits:
    """The two budgets every API request is charged to."""

    def __init__(self, app: Flask):
        uri, clock = app.config["RATELIMIT_STORAGE_URI"], app.config["CLOCK"]
        self._storage = StorageProbe(clock)
        self._local = LocalWindows(clock) if uri.startswith("memory://") else None
        if self._local is None:
            options = storage_options(uri, app.config["RATELIMIT_STORAGE_TIMEOUT"])
            self._shared = MovingWindowRateLimiter(storage_from_string(uri, **options))
        self.auth_failures_per_minute = app.config["AUTH_FAILURE_RATE_LIMIT"]

    def charge_organization(self, org_id: str, per_minute: int) -> Window:
        """Count one request against the organization; raise 429 when its window is full."""
        window = self._charge("org", org_id, per_minute)
        if not window.allowed:
            RATE_LIMITED.labels("organization").inc()
            raise ApiError(429, "rate_limited",
                           f"Rate limit of {per_minute} requests per minute exceeded.",
                           headers=window.headers())
        return window

    def charge_failed_login(self, address: str) -> None:
        """Count a failed authentication against the client address; 429 past its budget."""
        window = self._charge("auth-failure", address or "unknown", self.auth_failures_per_minute)
        if not window.allowed:
            RATE_LIMITED.labels("failed_auth").inc()
            raise ApiError(429, "rate_limited", "Too many failed authentication attempts.",
                           headers={"Retry-After": str(window.seconds_to_reset())})

    def _charge(self, scope: str, key: str, per_minute: int) -> Window:
        if self._local is not None:
            return self._local.hit(scope, key, per_minute)
        # Fail open: an unreachable or frozen storage must turn no request into a 500 or a hang.
        # `limits` times Redis's windows on the real clock (it takes no other), so these use it too.
        now = time.time()
        unlimited = Window(per_minute, per_minute, now + WINDOW_SECONDS, True, now)
        if self._storage.should_skip():
            return unlimited
        item = Budget(per_minute)
        try:
            allowed = self._shared.hit(item, scope, key)
            reset_at, remaining = self._shared.get_window_stats(item, scope, key)
        except Exception as error:  # noqa: BLE001 - any storage failure
            self._storage.failed(error)
            return unlimited
        self._storage.outage.recovered()
        return Window(per_minute, remaining, reset_at, allowed, now)
