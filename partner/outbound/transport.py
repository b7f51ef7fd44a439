"""One webhook attempt: an HTTP POST to vetted addresses, within one total deadline.

`Transport` is built once per process (by the dispatcher): it holds the one client TLS context
and the idle connections partners kept open (connections.py). Each attempt speaks HTTP/1.1 with
the standard library's http.client on a connection dialled to a vetted address, so by
construction there is no proxy (no environment is read), no redirect (nothing follows one), and
no name resolution (only IP literals are dialled).

A connection is reused only for the same scheme, host, port and vetted address, after the SSRF
check of the new attempt, and only if its last response was read to its end. A partner may close
an idle connection at any moment: one that looks closed is dropped before use, and when a reused
connection fails before any response byte arrives, the request goes once more on a fresh one.
"""

from __future__ import annotations

import http.client
import ipaddress
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from partner import outside_text
from partner.outbound.connections import IdleConnections, PartnerConnection, client_tls_context, dial

MAX_RESPONSE_BYTES = 65536
EXCERPT_BYTES = outside_text.EXCERPT_BYTES

_NETWORK_ERRORS = (OSError, http.client.HTTPException)
# What a partner closing an idle connection looks like to the next request sent on it.
_DROPPED_WHILE_IDLE = (ConnectionResetError, BrokenPipeError, ConnectionAbortedError,
                       ssl.SSLEOFError, ssl.SSLZeroReturnError)


class DeliveryTarget(Protocol):
    """What post() reads from `ssrf.Target`."""

    @property
    def scheme(self) -> str: ...

    @property
    def host(self) -> str: ...

    @property
    def port(self) -> int: ...

    @property
    def request_target(self) -> str: ...

    @property
    def addresses(self) -> tuple[str, ...]: ...


@dataclass(frozen=True)
class AttemptResult:
    ok: bool  # True only for a 2xx received completely within the deadline
    http_status: int | None  # None when no status line came
    error: str | None  # None, "http_status", "timeout", "connection_error", "tls_error" or "redirect"
    response_excerpt: str  # the body's start, at most EXCERPT_BYTES once encoded (outside_text.excerpt)
    duration_ms: int


class Deadline:
    """The end of one attempt, DNS lookup included; sockets ask it how long they may block.

    Runs on time.monotonic (the clock socket timeouts use); `clock` only measures `elapsed_ms`.
    """

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        if seconds <= 0:
            raise ValueError("timeout must be positive")
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


@dataclass
class _Reply:
    status: int | None = None
    body: bytearray = field(default_factory=bytearray)


class Transport:
    """Sends attempts; one per process, shared by every delivery thread."""

    def __init__(self, ca_bundle: str = "", idle: IdleConnections | None = None) -> None:
        self.tls = client_tls_context(ca_bundle)
        self.idle = idle if idle is not None else IdleConnections()

    def post(self, target: DeliveryTarget, body: bytes, headers: Mapping[str, str],
             deadline: Deadline) -> AttemptResult:
        """POST body to target before the deadline; never raises for network outcomes.

        The request carries `headers`, plus Host (`target.host`, with `:port` when not the
        scheme's default), Content-Length and `Accept-Encoding: identity` (the body is never
        decoded, so we ask for it plain). Outcomes:

        * 2xx whose body ended (or reached MAX_RESPONSE_BYTES) in time: ok.
        * 3xx: error "redirect", never followed; other statuses: error "http_status".
        * Deadline reached: error "timeout", with `http_status` set when the status line had
          already arrived (the body had not finished), else None.
        * Refused, reset, cut short: "connection_error"; handshake or certificate: "tls_error".
        """
        addresses = _parse_addresses(target)
        reply = _Reply()
        try:
            self._exchange(target, addresses, body, dict(headers), deadline, reply)
            error = _status_error(reply.status)
        except _NETWORK_ERRORS as failure:
            error = _classify(failure, deadline)
        return AttemptResult(
            ok=error is None,
            http_status=reply.status,
            error=error,
            response_excerpt=outside_text.excerpt(reply.body, EXCERPT_BYTES),
            duration_ms=deadline.elapsed_ms(),
        )

    def close(self) -> None:
        """Close the idle connections (they would otherwise close with the process)."""
        self.idle.close()

    def _exchange(self, target: DeliveryTarget, addresses: tuple[str, ...], body: bytes,
                  headers: dict[str, str], deadline: Deadline, reply: _Reply) -> None:
        reused = self._reusable(target, addresses)
        if reused is not None:
            try:
                return self._round_trip(reused, target, body, headers, deadline, reply)
            except _DROPPED_WHILE_IDLE:
                if reply.status is not None or deadline.has_passed():
                    raise
        connection = dial(target.scheme, target.host, target.port, addresses, deadline, self.tls)
        self._round_trip(connection, target, body, headers, deadline, reply)

    def _reusable(self, target: DeliveryTarget, addresses: tuple[str, ...]) -> PartnerConnection | None:
        """An idle connection to one of this attempt's vetted addresses, in their order."""
        for address in addresses:
            connection = self.idle.take((target.scheme, target.host, target.port, address))
            if connection is not None:
                return connection
        return None

    def _round_trip(self, connection: PartnerConnection, target: DeliveryTarget, body: bytes,
                    headers: dict[str, str], deadline: Deadline, reply: _Reply) -> None:
        """Send the request and read the reply; the connection goes back to the pool or is closed."""
        try:
            connection.arm(deadline)
            connection.request("POST", target.request_target, body, headers)
            response = connection.getresponse()
            reply.status = response.status
            _read_capped(response, reply.body)
        except BaseException:
            connection.close()
            raise
        # Reusable only if the body ended here (not cut at the cap) and the partner did not ask
        # to close (http.client then dropped the socket already).
        if response.isclosed() and connection.sock is not None:
            self.idle.give(connection)
        else:
            connection.close()


def _parse_addresses(target: DeliveryTarget) -> tuple[str, ...]:
    """The vetted addresses as canonical IP strings; anything that is not an IP literal is refused."""
    if target.scheme not in ("http", "https"):
        raise ValueError(f"unsupported scheme {target.scheme!r}")
    if not target.addresses:
        raise ValueError("target has no vetted address")
    return tuple(str(ipaddress.ip_address(address)) for address in target.addresses)


def _read_capped(response: http.client.HTTPResponse, into: bytearray) -> None:
    """Read the body until it ends or MAX_RESPONSE_BYTES have arrived.

    read1 hands over whatever has arrived, so `into` keeps the bytes read before a timeout.
    """
    while len(into) < MAX_RESPONSE_BYTES and response.length != 0:
        chunk = response.read1(MAX_RESPONSE_BYTES - len(into))
        if not chunk:
            break
        into += chunk
    if response.length and len(into) < MAX_RESPONSE_BYTES:  # read1 does not notice a body cut short
        raise http.client.IncompleteRead(bytes(into), response.length)
    if response.length == 0:
        response.close()  # http.client closes a Content-Length body only when read past its end


def _status_error(status: int | None) -> str | None:
    if status is not None and 200 <= status < 300:
        return None
    if status is not None and 300 <= status < 400:
        return "redirect"
    return "http_status"


def _classify(failure: BaseException, deadline: Deadline) -> str:
    if deadline.has_passed() or isinstance(failure, TimeoutError):
        return "timeout"
    if isinstance(failure, ssl.SSLError):
        return "tls_error"
    return "connection_error"
