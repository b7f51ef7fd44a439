"""Connections to partners: urllib3 makes and keeps them; we add what it cannot do, a deadline per
attempt and a bound on the sockets they hold.

urllib3 keeps the connections: one pool per (scheme, vetted address, port, TLS server name), at
most MAX_TARGETS pools (the least recently used closes), each keeping as many idle connections as
there are delivery threads; a connection the partner closed while idle is noticed and redialled
before use. For https it verifies the certificate against `server_hostname` (the URL's host, also
sent as SNI) whatever address was dialled.

What it does not do is bound idle sockets per process or expire them: the process's `Sockets`
(sockets.py) does, told by the pools' queues of idle connections and by each connection as it dials
and closes. A dial that meets EMFILE or ENFILE is SocketsBusy too: the process's failure, not the
partner's. A deleted or auto-disabled subscription's idle connections close at once
(PartnerPools.close_idle_to).

urllib3, like requests and httpx, times out per phase: every recv gets the full read timeout again,
so a partner dripping a byte a second could hold a thread for ever. Every socket we hand it is a
deadline socket instead: before each recv and send it sets its timeout to the time left in this
thread's attempt (`attempt.deadline`), or fails at once with TimeoutError. A reused connection so
obeys the new attempt's deadline, and every byte a partner sends shrinks the next read's budget.
"""

from __future__ import annotations

import errno
import functools
import socket
import ssl
import threading
from typing import Any, Protocol

import certifi
from urllib3 import HTTPConnectionPool, HTTPSConnectionPool, PoolManager
from urllib3.connection import HTTPConnection, HTTPSConnection

from partner.outbound.sockets import IdleQueue, Sockets, SocketsBusy

MAX_TARGETS = 64  # pools kept per process, one per partner address
_OUT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE)


class Deadline(Protocol):
    def remaining(self) -> float: ...


class _Attempt(threading.local):
    """What this thread's attempt tells the connections it uses. A connection serves one thread at
    a time, so the thread is how urllib3's layers let the attempt reach the socket."""

    deadline: Deadline | None = None
    dialled = False  # set when a new connection was made: a fresh one is not retried
    # Where the attempt is, for the words of a failure (causes.PHASES): the transport sets "connect",
    # the connection and its socket move it on; "body" is the transport's to tell (a status came).
    phase = "connect"
    refuse_idle = False  # set for the retry: an idle connection counts as dropped, so one is dialled


attempt = _Attempt()


@functools.lru_cache(maxsize=4)
def client_tls_context(ca_bundle: str = "") -> ssl.SSLContext:
    """The verifying client context of `ca_bundle` (a PEM file) or of certifi's trust store; built
    once per bundle and process (loading one costs tens of milliseconds), shared by every thread."""
    try:
        context = ssl.create_default_context(cafile=ca_bundle or certifi.where())
    except (OSError, ssl.SSLError) as error:
        raise ValueError(f"PARTNER_DELIVERY_CA_BUNDLE: cannot load {ca_bundle!r}: {error}") from None
    context.sslsocket_class = _DeadlineTLSSocket
    return context


class PartnerPools(PoolManager):
    """The process's pools, counted in `sockets`: no retries (the transport decides), no proxy (a
    PoolManager reads none)."""

    def __init__(self, tls: ssl.SSLContext, connections_per_target: int, sockets: Sockets) -> None:
        super().__init__(num_pools=MAX_TARGETS, maxsize=connections_per_target, retries=False, ssl_context=tls)
        self.pool_classes_by_scheme = {"http": functools.partial(_HTTPPool, sockets=sockets),
                                       "https": functools.partial(_HTTPSPool, sockets=sockets)}

    def close_idle_to(self, scheme: str, host: str, port: int) -> None:
        """Close the idle connections to (scheme, host, port), at whichever address: its subscription
        is gone. Attempts under way keep theirs, and the pools stay for them."""
        for key in self.pools.keys():
            if (key.key_scheme, key.key_server_hostname, key.key_port) == (scheme, host, port):
                pool = self.pools.get(key)
                for conn in pool.pool.take_back() if pool and pool.pool else ():
                    conn.close()


def _arm(sock: socket.socket) -> None:
    if attempt.deadline is not None:
        sock.settimeout(attempt.deadline.remaining())


class _DeadlineSocketMixin:
    def recv(self, *args: Any, **kwargs: Any) -> Any:
        self._before(phase="response head")
        return super().recv(*args, **kwargs)  # type: ignore[misc]

    def recv_into(self, *args: Any, **kwargs: Any) -> Any:
        self._before(phase="response head")
        return super().recv_into(*args, **kwargs)  # type: ignore[misc]

    def send(self, *args: Any, **kwargs: Any) -> Any:
        self._before(phase="request")
        return super().send(*args, **kwargs)  # type: ignore[misc]

    def sendall(self, *args: Any, **kwargs: Any) -> Any:
        self._before(phase="request")  # a plain socket's sendall treats its timeout as a total
        return super().sendall(*args, **kwargs)  # type: ignore[misc]

    def _before(self, phase: str) -> None:
        _arm(self)  # type: ignore[arg-type]
        attempt.phase = phase


class _DeadlineSocket(_DeadlineSocketMixin, socket.socket):
    pass


class _DeadlineTLSSocket(_DeadlineSocketMixin, ssl.SSLSocket):
    """Installed as the context's `sslsocket_class`; its sendall loops over send()."""


class _DeadlineConnectionMixin:
    """A urllib3 connection whose socket is a deadline socket, counted in `sockets` while it is open."""

    dialled_phase = "request"  # what follows the TCP connect

    def __init__(self, *args: Any, sockets: Sockets, **kwargs: Any) -> None:
        self.sockets = sockets
        super().__init__(*args, **kwargs)

    def _new_conn(self) -> socket.socket:
        self.sockets.opening()
        try:
            return self._dial()
        except BaseException as error:
            self.sockets.closed()
            if isinstance(error.__cause__, OSError) and error.__cause__.errno in _OUT_OF_DESCRIPTORS:
                raise SocketsBusy(f"no descriptor for a socket: {error.__cause__.strerror}") from error
            raise

    def close(self) -> None:
        if self.sock is not None:  # type: ignore[attr-defined]
            self.sockets.closed()
        super().close()  # type: ignore[misc]

    def _dial(self) -> socket.socket:
        # urllib3 dials the pool's host, a vetted IP literal: there is no name to resolve.
        plain: socket.socket = super()._new_conn()  # type: ignore[misc]
        attempt.dialled = True
        attempt.phase = self.dialled_phase
        sock = _DeadlineSocket(plain.family, plain.type, plain.proto, plain.detach())
        try:
            _arm(sock)  # bounds the TLS handshake, if any
        except TimeoutError:
            sock.close()
            raise
        return sock

    @property
    def is_connected(self) -> bool:
        return not attempt.refuse_idle and super().is_connected  # type: ignore[misc]


class _HTTPConnection(_DeadlineConnectionMixin, HTTPConnection):
    pass


class _HTTPSConnection(_DeadlineConnectionMixin, HTTPSConnection):
    dialled_phase = "TLS handshake"  # urllib3 wraps the socket next; the handshake calls no recv of ours


class PartnerPool:
    """A urllib3 pool whose idle connections and sockets are counted in `sockets`; the transport
    takes a connection, makes its exchange on the socket (exchange.py) and gives it back."""

    def __init__(self, host: str, port: int | None = None, *, sockets: Sockets, **kwargs: Any) -> None:
        self.sockets = sockets  # before urllib3 makes the queue (_new_pool_queue)
        super().__init__(host, port, sockets=sockets, **kwargs)  # type: ignore[call-arg]  # and each connection

    def take(self, connect_seconds: float) -> HTTPConnection:
        """An idle connection that still looks open, else a new one dialled within `connect_seconds`:
        urllib3's own choice (urlopen's), without the request it would then make."""
        conn: HTTPConnection = self._get_conn()  # type: ignore[attr-defined]
        if conn.sock is None:
            conn.timeout = connect_seconds
            try:
                conn.connect()
            except BaseException:
                self.give_back(conn, reusable=False)  # a failed handshake leaves the TCP socket open
                raise
        return conn

    def give_back(self, conn: HTTPConnection, reusable: bool) -> None:
        """Return `conn` to the pool, closed unless `reusable`."""
        if not reusable:
            conn.close()
        self._put_conn(conn)

    def _new_pool_queue(self, maxsize: int) -> IdleQueue:
        return IdleQueue(self.sockets, maxsize)

    def _put_conn(self, conn: HTTPConnection | None) -> None:
        super()._put_conn(conn)  # type: ignore[misc]
        self.sockets.close_idle()  # the budget and the age of idle connections, checked as each comes back


class _HTTPPool(PartnerPool, HTTPConnectionPool):
    ConnectionCls = _HTTPConnection


class _HTTPSPool(PartnerPool, HTTPSConnectionPool):
    ConnectionCls = _HTTPSConnection
