"""One webhook attempt: an HTTP POST to vetted addresses, within one total deadline.

`Transport` is built once per process (by the dispatcher): it holds the one client TLS context and
urllib3's pools of connections partners kept open (connections.py). Each attempt takes a connection
from the pool of (scheme, vetted address, port, host name), so a connection is never reused for
another address or name, and makes one exchange on it (exchange.py): nothing follows a redirect,
no proxy is read from the environment, and only IP literals are dialled, so no name is resolved.

Why not requests, nor urllib3's urlopen: each brings layers this needs none of, at a CPU cost per
attempt that was most of the engine's own (docs/performance.md). A requests Session must be told
not to read proxies, keep cookies or add headers, and even with allow_redirects=False it reads a
3xx body to its end, decoded (a gzip bomb behind a redirect would be inflated).

A partner may close an idle connection at any moment: urllib3 drops one that looks closed before
use; when a reused connection fails before any response byte arrives (the partner closed it as the
request went out), the request goes once more, on a freshly dialled connection.
"""

from __future__ import annotations

import http.client
import ipaddress
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from urllib3.exceptions import ConnectTimeoutError, HTTPError

from partner import safe_text
from partner.outbound import causes, exchange
from partner.outbound.connections import PartnerPool, PartnerPools, attempt, client_tls_context
from partner.outbound.sockets import Sockets
from partner.outbound.ssrf import SCHEMES, Target

_NETWORK_ERRORS = (OSError, HTTPError, http.client.HTTPException)
# What a partner closing an idle connection looks like to the next request sent on it.
_DROPPED_WHILE_IDLE = (ConnectionResetError, BrokenPipeError, ConnectionAbortedError,
                       ssl.SSLEOFError, ssl.SSLZeroReturnError)


@dataclass(frozen=True)
class AttemptResult:
    ok: bool  # True only for a 2xx received completely within the deadline
    http_status: int | None  # None when no status line came
    error: str | None  # None, "http_status", "timeout", "connection_error", "tls_error" or "redirect"
    response_excerpt: str  # the body's start, cut by safe_text.excerpt (EXCERPT_BYTES once encoded)
    duration_ms: int
    error_detail: str | None = None  # a failure's cause in words (causes.py); None for http_status
    retry_after: str | None = None  # the response's Retry-After header, as sent (partner/concurrency.py reads it)


class Deadline:
    """The end of one attempt, DNS lookup included; sockets ask it how long they may block.

    Runs on time.monotonic (the clock socket timeouts use); `clock` only measures `elapsed_ms`.
    """

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        if seconds <= 0:
            raise ValueError("timeout must be positive")
        self.seconds = seconds
        self._clock = clock
        self._started_at = clock()
        self._ends_at = time.monotonic() + seconds

    def remaining(self) -> float:
        left = self._ends_at - time.monotonic()
        if left <= 0:
            raise TimeoutError("delivery deadline reached")
        return left

    def has_passed(self) -> bool:
        return time.monotonic() >= self._ends_at

    def elapsed_ms(self) -> int:
        return max(0, round((self._clock() - self._started_at) * 1000))


class Transport:
    """Sends attempts; one per process, shared by every delivery thread (at most
    `connections_per_target` of them: each partner address keeps up to that many idle connections,
    all of them together `sockets.most_idle`)."""

    def __init__(self, ca_bundle: str = "", connections_per_target: int = 64, sockets: Sockets | None = None) -> None:
        self.tls = client_tls_context(ca_bundle)
        self.sockets = sockets or Sockets()
        self.pools = PartnerPools(self.tls, connections_per_target, self.sockets)

    def post(self, target: Target, body: bytes, headers: Mapping[str, str],
             deadline: Deadline) -> AttemptResult:
        """POST body to target before the deadline, as an AttemptResult (its fields say the outcomes);
        never raises for network outcomes: SocketsBusy only, when no socket could be had. Adds Host,
        Content-Length and `Accept-Encoding: identity`: the body is never decoded, so it is asked for plain."""
        addresses = _parse_addresses(target)
        head = exchange.request_head(target.request_target, {**headers, "Host": _host_header(target),
                                                             "Accept-Encoding": "identity"}, len(body))
        reply = exchange.Reply()
        attempt.deadline, attempt.phase = deadline, "connect"
        detail = None
        try:
            self._exchange(target, addresses, head, body, deadline, reply)
            error = _status_error(reply.status)
            if error == "redirect":
                detail = causes.of_redirect(reply.status, reply.location)
        except _NETWORK_ERRORS as failure:
            error = _classify(failure, deadline)
            phase = "body" if reply.status is not None else attempt.phase
            detail = (causes.of_timeout(deadline.seconds, phase, len(reply.body)) if error == "timeout"
                      else causes.of_failure(failure, phase, reply.address, target.port))
        finally:
            attempt.deadline = None
        return AttemptResult(
            ok=error is None,
            http_status=reply.status,
            error=error,
            response_excerpt=safe_text.excerpt(reply.body),
            duration_ms=deadline.elapsed_ms(),
            error_detail=detail,
            retry_after=reply.retry_after,
        )

    def _exchange(self, target: Target, addresses: tuple[str, ...], head: bytes, body: bytes,
                  deadline: Deadline, reply: exchange.Reply) -> None:
        """To the first address that accepts a connection: each gets a fair share of the time left,
        so one black-holed address cannot starve the ones after it; the last gets all that remains."""
        for index, address in enumerate(addresses):
            connect_seconds = deadline.remaining() / (len(addresses) - index)
            try:
                return self._send(target, address, head, body, deadline, connect_seconds, reply)
            except ConnectTimeoutError:  # also NewConnectionError: nothing was sent
                if index == len(addresses) - 1:
                    raise

    def _send(self, target: Target, address: str, head: bytes, body: bytes, deadline: Deadline,
              connect_seconds: float, reply: exchange.Reply) -> None:
        pool = self.pools.connection_from_host(address, target.port, target.scheme,
                                               pool_kwargs={"server_hostname": target.host})
        attempt.dialled, reply.address = False, address
        try:
            return _round_trip(pool, head, body, connect_seconds, reply)
        except _NETWORK_ERRORS as failure:
            if (attempt.dialled or reply.status is not None or deadline.has_passed()
                    or not _caused_by(failure, _DROPPED_WHILE_IDLE)):
                raise
        attempt.refuse_idle, attempt.phase = True, "connect"
        try:  # its dial runs on urllib3's plain socket, before any deadline socket: bounded here
            _round_trip(pool, head, body, min(connect_seconds, deadline.remaining()), reply)
        finally:
            attempt.refuse_idle = False


def _round_trip(pool: PartnerPool, head: bytes, body: bytes, connect_seconds: float, reply: exchange.Reply) -> None:
    """Send the request on one of the pool's connections and read the reply; the connection goes
    back to the pool, closed unless it may carry another request."""
    conn = pool.take(connect_seconds)
    reusable = False
    try:
        reusable = exchange.post(conn.sock, head, body, reply)
    finally:
        pool.give_back(conn, reusable)


def _parse_addresses(target: Target) -> tuple[str, ...]:
    """The vetted addresses as canonical IP strings; anything that is not an IP literal is refused."""
    if target.scheme not in ("http", "https"):
        raise ValueError(f"unsupported scheme {target.scheme!r}")
    if not target.addresses:
        raise ValueError("target has no vetted address")
    return tuple(str(ipaddress.ip_address(address)) for address in target.addresses)


def _host_header(target: Target) -> str:
    shown = f"[{target.host}]" if ":" in target.host else target.host
    return shown if target.port == SCHEMES[target.scheme] else f"{shown}:{target.port}"


def _status_error(status: int | None) -> str | None:
    if status is not None and 200 <= status < 300:
        return None
    if status is not None and 300 <= status < 400:
        return "redirect"
    return "http_status"


def _caused_by(failure: BaseException, kinds: tuple[type[BaseException], ...]) -> bool:
    return any(isinstance(cause, kinds) for cause in causes.chain(failure))


def _classify(failure: BaseException, deadline: Deadline) -> str:
    if deadline.has_passed() or _caused_by(failure, (TimeoutError,)):
        return "timeout"
    if _caused_by(failure, (ssl.SSLError, ssl.CertificateError)):
        return "tls_error"
    return "connection_error"
