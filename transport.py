"""One webhook attempt: an HTTP POST to vetted addresses, within one total deadline.

How it plugs into requests 2.34 / urllib3 2.8:

* `_PinnedAdapter.get_connection_with_tls_context` (the hook requests documents for
  subclasses) returns a fresh urllib3 pool built for `target.host` and `target.port`.
  Because the pool's host *is* the target's host, http.client and urllib3 derive the
  Host header, the TLS SNI and the certificate hostname check from it, untouched.
* The pool's connection classes override urllib3's `_new_conn`, the one place that turns
  a host name into a socket, to connect to `target.addresses` in order instead. Every
  address is parsed as an IP literal first, so no name is ever resolved here and DNS
  rebinding has nothing to rebind.
* `request_url` returns `target.request_target`, so the path and query go out as the
  SSRF check parsed them rather than as requests would re-quote them.

The alternative (a URL holding the IP plus `server_hostname` / `assert_hostname` pool
options) needs a hand-made Host header, bracketed IPv6 URLs and a loop of whole requests
to fall back between addresses; the `_new_conn` seam keeps all of that inside connect().
"""

from __future__ import annotations

import ipaddress
import os
import socket
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import requests
import urllib3.exceptions
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.util import SKIP_HEADER
from urllib3.util.ssl_ import create_urllib3_context

MAX_RESPONSE_BYTES = 65536
EXCERPT_BYTES = 1024

_NETWORK_ERRORS = (
    requests.ConnectionError,
    requests.Timeout,
    urllib3.exceptions.HTTPError,
    OSError,
)
_TIMEOUT_ERRORS = (requests.Timeout, urllib3.exceptions.TimeoutError, TimeoutError)
_TLS_ERRORS = (requests.exceptions.SSLError, urllib3.exceptions.SSLError, ssl.SSLError)

_Address = ipaddress.IPv4Address | ipaddress.IPv6Address


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
    response_excerpt: str  # first EXCERPT_BYTES of the body, UTF-8 with replacement
    duration_ms: int


def post(
    target: DeliveryTarget,
    body: bytes,
    headers: Mapping[str, str],
    timeout: float,
    clock: Callable[[], float] = time.monotonic,
    *,
    verify: bool | str = True,
) -> AttemptResult:
    """POST body to target within a total deadline of `timeout` seconds; never raises for network outcomes.

    The request carries `headers`, plus Host (`target.host`, with `:port` when not the
    scheme's default), Content-Length and http.client's `Accept-Encoding: identity` (the
    body is never decoded, so we ask for it plain). Outcomes:

    * 2xx whose body ended (or reached MAX_RESPONSE_BYTES) in time: ok.
    * 3xx: error "redirect", never followed; other statuses: error "http_status".
    * Deadline reached: error "timeout", with `http_status` set when the status line had
      already arrived (the body had not finished), else None.
    * Refused, reset, cut short: "connection_error"; handshake or certificate: "tls_error".

    `clock` is read exactly twice, for `duration_ms`; the deadline itself runs on
    `time.monotonic`, the clock socket timeouts use. `verify` is for tests: a CA bundle
    path to trust instead of requests' default store.
    """
    addresses = _parse_addresses(target)
    if timeout <= 0:
        raise ValueError("timeout must be positive")
    if isinstance(verify, str) and not os.path.exists(verify):
        raise ValueError(f"no CA bundle at {verify!r}")

    started_at = clock()
    deadline = _Deadline(timeout)
    received = bytearray()
    status: int | None = None
    try:
        with _AttemptSession(target, addresses, deadline) as session, session.post(
            _url(target),
            data=body,
            headers=_request_headers(headers),
            timeout=timeout,
            allow_redirects=False,
            stream=True,
            verify=verify,
        ) as response:
            status = response.status_code
            _read_capped(response.raw, received)
    except _NETWORK_ERRORS as failure:
        error: str | None = _classify(failure, deadline)
    else:
        error = _status_error(status)
    duration_ms = max(0, round((clock() - started_at) * 1000))
    return AttemptResult(
        ok=error is None,
        http_status=status,
        error=error,
        response_excerpt=bytes(received[:EXCERPT_BYTES]).decode("utf-8", errors="replace"),
        duration_ms=duration_ms,
    )


def _parse_addresses(target: DeliveryTarget) -> tuple[_Address, ...]:
    if target.scheme not in ("http", "https"):
        raise ValueError(f"unsupported scheme {target.scheme!r}")
    if not target.addresses:
        raise ValueError("target has no vetted address")
    return tuple(ipaddress.ip_address(address) for address in target.addresses)


def _url(target: DeliveryTarget) -> str:
    # Only selects the adapter and names the response; the connection ignores it.
    host = f"[{target.host}]" if ":" in target.host else target.host
    return f"{target.scheme}://{host}:{target.port}{target.request_target}"


def _request_headers(headers: Mapping[str, str]) -> dict[str, str]:
    sent = dict(headers)
    if not any(name.lower() == "user-agent" for name in sent):
        sent["User-Agent"] = SKIP_HEADER  # not urllib3's default one either
    return sent


def _read_capped(raw: Any, into: bytearray) -> None:
    """Read the raw body until it ends or MAX_RESPONSE_BYTES have arrived.

    read1 hands over whatever has arrived, so `into` keeps the bytes read before a timeout.
    """
    while len(into) < MAX_RESPONSE_BYTES:
        chunk = raw.read1(MAX_RESPONSE_BYTES - len(into), decode_content=False)
        if not chunk:
            return
        into += chunk


def _status_error(status: int | None) -> str | None:
    if status is not None and 200 <= status < 300:
        return None
    if status is not None and 300 <= status < 400:
        return "redirect"
    return "http_status"


def _classify(failure: BaseException, deadline: _Deadline) -> str:
    if deadline.has_passed() or isinstance(failure, _TIMEOUT_ERRORS):
        return "timeout"
    if isinstance(failure, _TLS_ERRORS):
        return "tls_error"
    return "connection_error"


# The deadline is total. Every blocking socket operation (connect, TLS handshake, each
# send and each recv, including those http.client makes while reading the status line
# and headers) first sets the socket timeout to the time left, or fails at once with
# TimeoutError when none is left. A server dripping bytes cannot stretch the attempt:
# every byte it sends shrinks the budget of the next read. This was chosen over a
# watchdog thread that shuts the socket down at the deadline: no extra thread, no race
# between the watchdog and a close, and every library layer sees a plain socket.timeout.


class _Deadline:
    """The end of the attempt; sockets ask it how long their next operation may block."""

    def __init__(self, seconds: float) -> None:
        self._ends_at = time.monotonic() + seconds

    def remaining(self) -> float:
        left = self._ends_at - time.monotonic()
        if left <= 0:
            raise TimeoutError("delivery deadline reached")
        return left

    def has_passed(self) -> bool:
        return time.monotonic() >= self._ends_at


class _DeadlineSocketMixin:
    deadline: _Deadline | None = None

    def _arm(self) -> None:
        if self.deadline is not None:
            self.settimeout(self.deadline.remaining())  # type: ignore[attr-defined]

    def recv(self, *args: Any, **kwargs: Any) -> Any:
        self._arm()
        return super().recv(*args, **kwargs)  # type: ignore[misc]

    def recv_into(self, *args: Any, **kwargs: Any) -> Any:
        self._arm()
        return super().recv_into(*args, **kwargs)  # type: ignore[misc]

    def send(self, *args: Any, **kwargs: Any) -> Any:
        self._arm()
        return super().send(*args, **kwargs)  # type: ignore[misc]

    def sendall(self, *args: Any, **kwargs: Any) -> Any:
        self._arm()  # a plain socket's sendall treats its timeout as a total
        return super().sendall(*args, **kwargs)  # type: ignore[misc]


class _DeadlineSocket(_DeadlineSocketMixin, socket.socket):
    pass


class _DeadlineTLSSocket(_DeadlineSocketMixin, ssl.SSLSocket):
    """Installed as the context's `sslsocket_class`; its sendall loops over send()."""


def _connect(addresses: tuple[_Address, ...], port: int, deadline: _Deadline) -> socket.socket:
    """Connect to the first address that accepts; each gets a fair share of the time left.

    The share keeps one black-holed address from starving the ones after it; the last
    address gets all that remains.
    """
    failure: OSError = ConnectionError("no address to connect to")
    for index, address in enumerate(addresses):
        share = deadline.remaining() / (len(addresses) - index)
        family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
        sock = None
        try:
            sock = _DeadlineSocket(family, socket.SOCK_STREAM)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(share)
            sock.connect((str(address), port))
        except OSError as error:
            if sock is not None:
                sock.close()
            failure = error
            continue
        sock.settimeout(deadline.remaining())  # bounds the TLS handshake, if any
        sock.deadline = deadline
        return sock
    raise failure


class _PinnedConnectionMixin:
    """A urllib3 connection that keeps its host for HTTP and TLS but dials vetted IPs."""

    def __init__(
        self, *args: Any, addresses: tuple[_Address, ...], deadline: _Deadline, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self._addresses = addresses
        self._deadline = deadline

    def _new_conn(self) -> socket.socket:
        try:
            return _connect(self._addresses, self.port, self._deadline)  # type: ignore[attr-defined]
        except TimeoutError as error:
            raise urllib3.exceptions.ConnectTimeoutError(self, f"Connect timed out: {error}") from error
        except OSError as error:
            message = f"Failed to connect: {error}"
            raise urllib3.exceptions.NewConnectionError(self, message) from error  # type: ignore[arg-type]


class _PinnedHTTPConnection(_PinnedConnectionMixin, HTTPConnection):
    pass


class _PinnedHTTPSConnection(_PinnedConnectionMixin, HTTPSConnection):
    def connect(self) -> None:
        super().connect()
        self.sock.deadline = self._deadline  # type: ignore[union-attr]


class _PinnedHTTPPool(HTTPConnectionPool):
    ConnectionCls = _PinnedHTTPConnection


class _PinnedHTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _PinnedHTTPSConnection


class _PinnedAdapter(HTTPAdapter):
    """Sends its session's request to one target's vetted addresses, never through a proxy."""

    def __init__(self, target: DeliveryTarget, addresses: tuple[_Address, ...], deadline: _Deadline) -> None:
        super().__init__(max_retries=0)
        self._target = target
        self._connection_kwargs = {"addresses": addresses, "deadline": deadline, "maxsize": 1}
        self._pools: list[HTTPConnectionPool] = []

    def get_connection_with_tls_context(
        self, request: Any, verify: Any, proxies: Any = None, cert: Any = None
    ) -> HTTPConnectionPool:
        """A fresh pool for the target, whatever the request's URL says; verify is applied by cert_verify."""
        host, port = self._target.host, self._target.port
        pool: HTTPConnectionPool
        if self._target.scheme == "https":
            context = create_urllib3_context(cert_reqs=ssl.CERT_REQUIRED if verify else ssl.CERT_NONE)
            context.sslsocket_class = _DeadlineTLSSocket
            pool = _PinnedHTTPSPool(host, port, ssl_context=context, **self._connection_kwargs)
        else:
            pool = _PinnedHTTPPool(host, port, **self._connection_kwargs)
        self._pools.append(pool)
        return pool

    def request_url(self, request: Any, proxies: Any) -> str:
        return self._target.request_target

    def close(self) -> None:
        super().close()
        for pool in self._pools:
            pool.close()


class _AttemptSession(requests.Session):
    """A one-request session: no proxy variables, no .netrc, no default headers."""

    def __init__(self, target: DeliveryTarget, addresses: tuple[_Address, ...], deadline: _Deadline) -> None:
        super().__init__()
        self.trust_env = False
        self.headers.clear()
        adapter = _PinnedAdapter(target, addresses, deadline)
        self.mount("http://", adapter)
        self.mount("https://", adapter)

    def get_redirect_target(self, resp: requests.Response) -> str | None:
        # Even with allow_redirects=False, Session.send walks resolve_redirects once to
        # prepare `response.next`, reading the WHOLE 3xx body. We never follow, so say so.
        return None
