"""Connections to partners: dialled to vetted addresses only, bounded by the attempt's deadline, kept
alive between attempts in a small idle pool.

* `client_tls_context` is built once per process: loading a trust store costs tens of
  milliseconds, far more than the rest of an attempt.
* `dial` connects to the first vetted address that accepts; a name is never resolved here, so
  DNS rebinding has nothing to rebind. For https the TLS handshake checks the certificate
  against the URL's host name (also sent as SNI), whatever address was dialled.
* `IdleConnections` keeps what a partner left open, keyed by scheme, host, port *and the address
  dialled*: a connection is only ever reused for an address that was vetted again for this attempt.
"""

from __future__ import annotations

import functools
import http.client
import select
import socket
import ssl
import threading
import time
from collections import OrderedDict
from typing import Any, Protocol

import certifi

# What partners' servers commonly allow (nginx 75 s, Apache and Node.js 5 s): a connection idle
# longer than this is more likely closed than not. One that closed sooner is caught before use.
IDLE_SECONDS = 20.0
MAX_IDLE = 128  # per process, all partners together: a file descriptor each

Key = tuple[str, str, int, str]  # scheme, host, port, address dialled


class Deadline(Protocol):
    def remaining(self) -> float: ...


@functools.lru_cache(maxsize=4)
def client_tls_context(ca_bundle: str = "") -> ssl.SSLContext:
    """The verifying client context of `ca_bundle` (a PEM file) or of requests' default trust store
    (certifi); built once per bundle and process, then shared by every attempt and thread."""
    try:
        context = ssl.create_default_context(cafile=ca_bundle or certifi.where())
    except (OSError, ssl.SSLError) as error:
        raise ValueError(f"PARTNER_DELIVERY_CA_BUNDLE: cannot load {ca_bundle!r}: {error}") from None
    context.sslsocket_class = _DeadlineTLSSocket
    return context


# The deadline is total. Every blocking socket operation (connect, each send and each recv,
# including those http.client makes while reading the status line and headers) first sets the
# socket timeout to the time left, or fails at once with TimeoutError when none is left. A server
# dripping bytes cannot stretch the attempt: every byte it sends shrinks the budget of the next
# read. A reused connection gets the new attempt's deadline before its first byte is sent.


class _DeadlineSocketMixin:
    deadline: Deadline | None = None

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


class PartnerConnection(http.client.HTTPConnection):
    """An HTTP/1.1 connection on a socket `dial` made; it never connects by itself.

    `host` and `port` are the URL's: http.client derives the Host header from them.
    """

    def __init__(self, key: Key, sock: socket.socket) -> None:
        scheme, host, port, _ = key
        super().__init__(host, port)
        self.default_port = 443 if scheme == "https" else 80  # Host carries :port only when needed
        self.key = key
        self.sock = sock

    def connect(self) -> None:
        raise ConnectionError("connection already closed")  # a closed one is never redialled here

    def arm(self, deadline: Deadline) -> None:
        """Bound every later socket operation by this attempt's deadline."""
        self.sock.deadline = deadline  # type: ignore[union-attr]

    def looks_usable(self) -> bool:
        """False if the partner closed it (or sent anything unasked) while it sat idle."""
        sock = self.sock
        if sock is None or (isinstance(sock, ssl.SSLSocket) and sock.pending()):
            return False
        poller = select.poll()  # not select(): file descriptors past 1024 are fine
        poller.register(sock, select.POLLIN | select.POLLPRI)
        return not poller.poll(0)


def dial(scheme: str, host: str, port: int, addresses: tuple[str, ...], deadline: Deadline,
         tls: ssl.SSLContext) -> PartnerConnection:
    """Connect to the first of `addresses` that accepts (TLS for https); its key names the one dialled."""
    sock, address = _connect(addresses, port, deadline)
    if scheme == "https":
        try:
            sock = tls.wrap_socket(sock, server_hostname=host)  # timeout: set by _connect
        except BaseException:
            sock.close()
            raise
    connection = PartnerConnection((scheme, host, port, address), sock)
    connection.arm(deadline)
    return connection


def _connect(addresses: tuple[str, ...], port: int, deadline: Deadline) -> tuple[socket.socket, str]:
    """Each address gets a fair share of the time left: one black-holed address cannot starve the
    ones after it; the last gets all that remains."""
    failure: OSError = ConnectionError("no address to connect to")
    for index, address in enumerate(addresses):
        share = deadline.remaining() / (len(addresses) - index)
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        sock = None
        try:
            sock = _DeadlineSocket(family, socket.SOCK_STREAM)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(share)
            sock.connect((address, port))
        except OSError as error:
            if sock is not None:
                sock.close()
            failure = error
            continue
        sock.settimeout(deadline.remaining())  # bounds the TLS handshake, if any
        return sock, address
    raise failure


class IdleConnections:
    """Connections kept open after a complete response, at most `max_idle`, each for `idle_seconds`."""

    def __init__(self, max_idle: int = MAX_IDLE, idle_seconds: float = IDLE_SECONDS) -> None:
        self.max_idle = max_idle
        self.idle_seconds = idle_seconds
        self._lock = threading.Lock()
        self._idle: OrderedDict[PartnerConnection, float] = OrderedDict()  # oldest first
        self._by_key: dict[Key, list[PartnerConnection]] = {}

    def take(self, key: Key) -> PartnerConnection | None:
        """The most recently used live connection for exactly this key, or None."""
        while True:
            with self._lock:
                stale = self._expire(time.monotonic())
                stack = self._by_key.get(key)
                connection = stack.pop() if stack else None
                if connection is not None:
                    self._forget(connection)
            _close(stale)
            if connection is None or connection.looks_usable():
                return connection
            connection.close()

    def give(self, connection: PartnerConnection) -> None:
        """Keep a connection whose last response was read to its end, for the next attempt."""
        connection.sock.deadline = None  # type: ignore[union-attr]
        with self._lock:
            self._idle[connection] = time.monotonic()
            self._by_key.setdefault(connection.key, []).append(connection)
            evicted = [self._pop_oldest()] if len(self._idle) > self.max_idle else []
        _close(evicted)

    def close(self) -> None:
        with self._lock:
            connections = list(self._idle)
            self._idle.clear()
            self._by_key.clear()
        _close(connections)

    def __len__(self) -> int:
        return len(self._idle)

    def _expire(self, now: float) -> list[PartnerConnection]:
        stale = []
        while self._idle and now - next(iter(self._idle.values())) > self.idle_seconds:
            stale.append(self._pop_oldest())
        return stale

    def _pop_oldest(self) -> PartnerConnection:
        connection, _ = self._idle.popitem(last=False)
        self._by_key[connection.key].remove(connection)
        self._drop_empty(connection.key)
        return connection

    def _forget(self, connection: PartnerConnection) -> None:
        del self._idle[connection]
        self._drop_empty(connection.key)

    def _drop_empty(self, key: Key) -> None:
        if not self._by_key.get(key):
            self._by_key.pop(key, None)


def _close(connections: list[PartnerConnection]) -> None:
    for connection in connections:
        connection.close()
