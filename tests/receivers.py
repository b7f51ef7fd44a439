"""Real receivers on loopback for delivery tests: HTTP ones that record what arrives and answer as
told, raw-socket ones (RawServer) that misbehave below HTTP, and keep-alive ports by the hundred
(KeepAlivePorts)."""

from __future__ import annotations

import heapq
import itertools
import re
import selectors
import socket
import ssl
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.support import eventually


@dataclass
class Received:
    path: str
    headers: dict
    body: bytes
    arrived_at: float


@dataclass
class Receiver:
    """Answers each POST with the next entry of `script` (the last one repeats): a status code,
    or a callable taking the handler, for misbehaving servers. With `tls`, it serves HTTPS and keeps
    connections alive (HTTP/1.1), as most partners do; `connections` counts those accepted."""
    host: str = "127.0.0.1"
    script: list = field(default_factory=lambda: [200])
    received: list = field(default_factory=list)
    tls: ssl.SSLContext | None = None
    connections: int = 0

    def start(self) -> "Receiver":
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1" if receiver.tls else "HTTP/1.0"

            def setup(self):
                receiver.connections += 1
                super().setup()

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                receiver.received.append(Received(self.path, dict(self.headers), body, time.monotonic()))
                step = receiver.script[min(len(receiver.received), len(receiver.script)) - 1]
                if callable(step):
                    return step(self)
                self.send_response(step)
                if 300 <= step < 400:
                    self.send_header("Location", receiver.redirect_to)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args):
                pass

        self.redirect_to = "/"
        self.server = ThreadingHTTPServer((self.host, 0), Handler)
        self.server.daemon_threads = True
        self.server.handle_error = lambda request, address: None  # a refused handshake may be the point
        # Set by stop(): a step still hanging or dripping ends, since closing the server waits for it.
        self.server.stopped = threading.Event()
        if self.tls:  # the handshake happens in the handler's thread, on its first read
            self.server.socket = self.tls.wrap_socket(self.server.socket, server_side=True,
                                                      do_handshake_on_connect=False)
        threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True).start()
        return self

    @property
    def url(self) -> str:
        return self.url_for(self.host)

    def url_for(self, host: str) -> str:
        """Its URL under another host name (one the test's resolver maps to its address)."""
        return f"{'https' if self.tls else 'http'}://{host}:{self.server.server_port}/hook"

    def stop(self) -> None:
        self.server.stopped.set()
        self.server.shutdown()
        self.server.server_close()

    def wait_for(self, count: int, seconds: float = 30.0) -> bool:
        """Whether `count` deliveries have arrived within `seconds` (generous: see support.eventually)."""
        return eventually(lambda: len(self.received) >= count, seconds, pause=0.005)


def hang(seconds: float):
    """A step that accepts the request and answers nothing for `seconds` (or until the receiver stops)."""
    def step(handler):
        handler.server.stopped.wait(seconds)
    return step


def late(seconds: float, status: int = 200):
    """A step that answers `status` after `seconds` (or once the receiver stops): a slow partner."""
    def step(handler):
        handler.server.stopped.wait(seconds)
        handler.send_response(status)
        handler.send_header("Content-Length", "0")
        handler.end_headers()
    return step


def too_many_after_retry_after(seconds: int):
    """A step that answers 429 with `Retry-After: seconds`."""
    def step(handler):
        handler.send_response(429)
        handler.send_header("Retry-After", str(seconds))
        handler.send_header("Content-Length", "0")
        handler.end_headers()
    return step


def drip(seconds: float, interval: float = 0.1):
    """A step that sends 200 headers, then one body byte every `interval` for `seconds` (or until the
    receiver stops)."""
    def step(handler):
        handler.send_response(200)
        handler.send_header("Content-Length", str(int(seconds / interval) + 1))
        handler.end_headers()
        deadline = time.monotonic() + seconds
        try:
            while time.monotonic() < deadline:
                handler.wfile.write(b"x")
                handler.wfile.flush()
                if handler.server.stopped.wait(interval):
                    return
        except OSError:
            pass
    return step


@dataclass
class RawServer:
    """Accepts on loopback and hands each connection to `behave(conn, server)` in a thread: for
    partners that break HTTP itself. The serve_raw fixture (conftest.py) starts and stops them."""

    behave: Callable[[socket.socket, RawServer], None]
    listener: socket.socket = field(default_factory=lambda: socket.create_server(("127.0.0.1", 0)))
    stopped: threading.Event = field(default_factory=threading.Event)
    accepted: int = 0
    notes: list = field(default_factory=list)

    @property
    def port(self) -> int:
        return self.listener.getsockname()[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def serve(self) -> None:
        self.listener.settimeout(0.02)
        while not self.stopped.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            self.accepted += 1
            threading.Thread(target=self.handle, args=(conn,), daemon=True).start()

    def handle(self, conn: socket.socket) -> None:
        with conn:
            try:
                self.behave(conn, self)
            except OSError as error:  # the client hung up: what several tests wait for
                self.notes.append(error)


def drip_bytes(conn: socket.socket, server: RawServer, data: bytes, every: float = 0.2) -> None:
    """Send `data` one byte every `every` seconds, until it ends or the server stops."""
    for byte in data:
        if server.stopped.wait(every):
            return
        conn.sendall(bytes([byte]))


def read_request(conn: socket.socket) -> bytes | None:
    """One request off a raw connection (its head; the body is read and dropped), None at its end."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(re.search(rb"(?i)\r\ncontent-length: *([0-9]+)", head)[1])
    while len(body) < length:
        body += conn.recv(65536)
    return head


class KeepAlivePorts:
    """HTTP/1.1 receivers on `count` loopback ports, all served by one thread (selectors), for tests
    that hold hundreds of connections at once: each keeps every connection open, as most partners do,
    and answers each request `status` after `delay` seconds, so attempts sent together overlap.
    `events` holds the X-VC-Event-Id of each request answered; `open` counts the connections held,
    `accepted` those accepted on each port."""

    def __init__(self, count: int = 1, delay: float = 0.0, status: int = 200):
        self.delay, self.events, self.open, self.accepted = delay, [], 0, Counter()
        self._answer = f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\nContent-Length: 2\r\n\r\nok".encode()
        self.listeners = [socket.create_server(("127.0.0.1", 0), backlog=1024) for _ in range(count)]
        self.ports = [listener.getsockname()[1] for listener in self.listeners]
        self.stopped = threading.Event()
        self._selector = selectors.DefaultSelector()
        for listener in self.listeners:
            listener.setblocking(False)
            self._selector.register(listener, selectors.EVENT_READ)
        self._due: list[tuple[float, int, socket.socket, bytes]] = []  # answers waiting for their time
        self._order = itertools.count()  # ties in _due never compare sockets
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.stopped.set()
        self._thread.join(timeout=5)
        for key in list(self._selector.get_map().values()):
            key.fileobj.close()
        self._selector.close()

    def _serve(self) -> None:
        while not self.stopped.is_set():
            wait = min(0.05, max(0.0, self._due[0][0] - time.monotonic())) if self._due else 0.05
            for key, _ in self._selector.select(wait):
                if key.fileobj in self.listeners:
                    self._accept(key.fileobj)
                else:
                    self._read(key.fileobj, key.data)
            while self._due and self._due[0][0] <= time.monotonic():
                _, _, conn, event = heapq.heappop(self._due)
                try:
                    conn.sendall(self._answer)
                    self.events.append(event.decode())
                except OSError:
                    pass  # the client gave up on it

    def _accept(self, listener: socket.socket) -> None:
        try:
            conn, _ = listener.accept()
        except BlockingIOError:
            return
        conn.setblocking(True)  # a 40-byte answer never fills the buffer; reads wait for select
        self._selector.register(conn, selectors.EVENT_READ, bytearray())
        self.open += 1
        self.accepted[listener.getsockname()[1]] += 1

    def _read(self, conn: socket.socket, buffer: bytearray) -> None:
        try:
            chunk = conn.recv(65536)
        except OSError:
            chunk = b""
        if not chunk:
            self._selector.unregister(conn)
            conn.close()
            self.open -= 1
            return
        buffer += chunk
        while b"\r\n\r\n" in buffer:
            head, _, rest = bytes(buffer).partition(b"\r\n\r\n")
            length = int(re.search(rb"(?i)\r\ncontent-length: *([0-9]+)", head)[1])
            if len(rest) < length:
                return
            event = re.search(rb"(?i)\r\nx-vc-event-id: *([^\r]*)", head)
            heapq.heappush(self._due, (time.monotonic() + self.delay, next(self._order), conn,
                                       event[1] if event else b""))
            del buffer[:len(head) + 4 + length]
