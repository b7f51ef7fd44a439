"""Tests for transport.py: real servers on loopback, well-behaved and not."""

from __future__ import annotations

import dataclasses
import errno
import gc
import http.server
import os
import re
import socket
import ssl
import struct
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime

import pytest

from partner.outbound import causes
from partner.outbound.ssrf import Target
from tests.receivers import RawServer, drip_bytes, read_request
from tests.support import SLACK_SECONDS, eventually
from partner.outbound.transport import AttemptResult, Deadline, Transport
from partner.safe_text import EXCERPT_BYTES

HOOK_HOST = "hooks.example.test"  # .test never resolves: a request that arrives used no DNS
HEADERS = {
    "Content-Type": "application/json",
    "User-Agent": "PartnerWebhooks/1.0",
    "X-VC-Event": "vc.test.ping",
}
BODY = b'{"event":"vc.test.ping"}'
TIMEOUT = 0.5  # the deadline the timeout tests cut at
MARGIN = SLACK_SECONDS  # what a loaded machine adds to it; the servers cut would go on for minutes
PATIENCE = 10.0  # the deadline of attempts meant to succeed: a loaded machine may be slow to answer


def target(
    port: int, host: str = "127.0.0.1", addresses: tuple[str, ...] = ("127.0.0.1",), scheme: str = "http"
) -> Target:
    shown = f"[{host}]" if ":" in host else host
    return Target(f"{scheme}://{shown}:{port}/hooks?a=1", scheme, host, port, "/hooks?a=1", addresses)


def post(tgt: Target, timeout: float = PATIENCE, transport: Transport | None = None,
         clock: Callable[[], float] = time.monotonic) -> AttemptResult:
    """One attempt, on `transport` (its idle connections, its trust store) or on a fresh one."""
    if transport is not None:
        return transport.post(tgt, BODY, HEADERS, Deadline(timeout, clock))
    once = Transport()
    try:
        return once.post(tgt, BODY, HEADERS, Deadline(timeout, clock))
    finally:
        once.pools.clear()


def timed_post(tgt: Target, timeout: float = TIMEOUT, transport: Transport | None = None) -> tuple:
    started = time.monotonic()
    result = post(tgt, timeout, transport)
    return result, time.monotonic() - started


# --- a well-behaved receiver: http.server ---------------------------------------------


@dataclass
class Received:
    path: str
    headers: list[tuple[str, str]]
    body: bytes


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.server.received.append(Received(self.path, list(self.headers.items()), body))
        status, headers, payload = self.server.reply
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args) -> None:
        pass


class Receiver(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, host: str = "127.0.0.1", tls: ssl.SSLContext | None = None):
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        super().__init__((host, 0), _Handler)
        if tls is not None:  # the handshake happens in the handler thread, on first read
            self.socket = tls.wrap_socket(self.socket, server_side=True, do_handshake_on_connect=False)
        self.port = self.server_address[1]
        self.connections = 0
        self.received: list[Received] = []
        self.reply: tuple[int, dict[str, str], bytes] = (200, {}, b"thanks")

    def get_request(self):
        accepted = super().get_request()
        self.connections += 1
        return accepted

    def handle_error(self, request, client_address) -> None:
        pass  # failed TLS handshakes are the point of some tests


@pytest.fixture
def serve() -> Iterator[Callable[..., Receiver]]:
    servers: list[Receiver] = []

    def start(host: str = "127.0.0.1", tls: ssl.SSLContext | None = None) -> Receiver:
        server = Receiver(host, tls)
        threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.fixture
def receiver(serve) -> Receiver:
    return serve()


# --- misbehaving servers: raw sockets (RawServer, the serve_raw fixture) ----------------------


OK_KEEP_ALIVE = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


def keep_alive_then(second: Callable[[socket.socket, RawServer], None]):
    """A raw server's behaviour: answer a connection's first request at once and keep the connection
    open; then, once the next request arrives on it, `second`."""
    def behave(conn: socket.socket, server: RawServer) -> None:
        if read_request(conn) is None:
            return
        conn.sendall(OK_KEEP_ALIVE)
        if read_request(conn) is not None:
            second(conn, server)
    return behave


def refused_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as probe:
        return probe.getsockname()[1]


# --- outcomes by status ----------------------------------------------------------------


def test_2xx_is_ok_with_the_body_as_excerpt(receiver):
    result = post(target(receiver.port))

    assert result == AttemptResult(True, 200, None, "thanks", result.duration_ms)
    assert receiver.received[0].body == BODY


def test_204_is_ok(receiver):
    receiver.reply = (204, {}, b"")

    result = post(target(receiver.port))

    assert result == AttemptResult(True, 204, None, "", result.duration_ms)


def test_500_is_an_http_status_failure(receiver):
    receiver.reply = (500, {}, b"boom")

    result = post(target(receiver.port))

    assert result == AttemptResult(False, 500, "http_status", "boom", result.duration_ms)
    assert result.error_detail is None  # the status and the excerpt say it


def test_redirect_is_reported_and_never_followed(serve):
    elsewhere = serve()
    redirecting = serve()
    redirecting.reply = (302, {"Location": f"http://127.0.0.1:{elsewhere.port}/"}, b"moved")

    result = post(target(redirecting.port))

    assert (result.ok, result.http_status, result.error) == (False, 302, "redirect")
    assert result.error_detail == f"302 to http://127.0.0.1:{elsewhere.port}/"
    assert elsewhere.received == []


@pytest.mark.parametrize(("location", "detail"), [
    ("https://user:pa55@new.example.com:8443/in?token=s3cret#top", "301 to https://new.example.com:8443/in?…"),
    ("/relative/path", "301 to /relative/path"),
    ("https://new.example.com/" + "p" * 300, "301 to https://new.example.com/" + "p" * 168 + "…"),
    ("http://[::1", "301 to an unreadable Location"),
    ("mailto:user:pa55@example.com", "301 to mailto:…"),
    ("user:pa55@new.example.com/in", "301 to user:…"),
    ("https:user:pa55@new.example.com", "301 to https:…"),
    (None, "301 without a Location header"),
])
def test_a_redirect_names_its_location_without_credentials_or_query_and_bounded(receiver, location, detail):
    receiver.reply = (301, {"Location": location} if location else {}, b"")

    result = post(target(receiver.port))

    assert (result.error, result.error_detail) == ("redirect", detail)
    assert len(result.error_detail) <= 200


def test_excerpt_is_at_most_1024_bytes_once_encoded_with_invalid_utf8_replaced(receiver):
    receiver.reply = (400, {}, b"\xff" + b"a" * 5000)

    result = post(target(receiver.port))

    assert result.response_excerpt == "\ufffd" + "a" * (EXCERPT_BYTES - 3)  # U+FFFD is three bytes


def test_duration_comes_from_the_injected_clock(receiver):
    readings = iter([100.0, 100.25])

    result = post(target(receiver.port), clock=lambda: next(readings))

    assert result.duration_ms == 250


@pytest.mark.parametrize(("status", "error"), [(200, None), (302, "redirect")])
def test_a_huge_body_is_read_only_up_to_the_cap(serve_raw, status, error):
    size = 200 * 1024 * 1024  # more than any loopback socket buffers can hold

    def huge(conn, server):
        conn.sendall(f"HTTP/1.1 {status} X\r\nLocation: /x\r\nContent-Length: {size}\r\n\r\n".encode())
        chunk, sent = b"x" * 65536, 0
        while sent < size and not server.stopped.is_set():
            conn.sendall(chunk)
            sent += len(chunk)
        server.notes.append("sent everything")

    server = serve_raw(huge)
    transport = Transport()
    result, elapsed = timed_post(target(server.port), timeout=30, transport=transport)

    assert (result.http_status, result.error, result.response_excerpt) == (status, error, "x" * EXCERPT_BYTES)
    assert elapsed < SLACK_SECONDS
    assert eventually(lambda: server.notes)
    assert isinstance(server.notes[0], OSError)  # the client hung up mid-body


# --- failures without a response -------------------------------------------------------


def test_refused_connection_is_a_connection_error():
    port = refused_port()

    result = post(target(port))

    assert result == AttemptResult(False, None, "connection_error", "", result.duration_ms,
                                   f"connection refused by 127.0.0.1 port {port}")


def test_a_reset_is_a_connection_error_that_says_so(serve_raw):
    def reset(conn, server):
        read_request(conn)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST, not FIN

    server = serve_raw(reset)
    result = post(target(server.port))

    assert (result.error, result.error_detail) == (
        "connection_error", "connection reset by the receiver while waiting for the response head")


def answering_each(reply: bytes):
    """A raw server's behaviour: `reply` to every request on the connection, until it closes."""
    def behave(conn, server):
        while read_request(conn) is not None:
            conn.sendall(reply)
    return behave


def test_a_chunked_body_is_read_to_its_end_and_its_connection_kept(serve_raw):
    server = serve_raw(answering_each(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                                      b"3\r\nabc\r\n4;ext=1\r\ndefg\r\n0\r\nX-Trailer: t\r\n\r\n"))
    transport = Transport()
    results = [post(target(server.port), transport=transport) for _ in range(3)]
    assert [(r.ok, r.response_excerpt) for r in results] == [(True, "abcdefg")] * 3
    assert server.accepted == 1


def test_a_reply_after_an_interim_103_is_never_read_as_the_next_attempts(serve_raw):
    server = serve_raw(answering_each(b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\n\r\n"
                                      b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 4\r\n\r\nfail"))
    transport = Transport()
    first, second = post(target(server.port), transport=transport), post(target(server.port), transport=transport)
    assert (first.ok, first.http_status, second.http_status) == (False, 103, 103)
    assert server.accepted == 2  # the first connection was closed, its 500 unread


@pytest.mark.parametrize("request_target, headers", [
    ("/hooks HTTP/1.1\r\nX-Smuggled: 1\r\n\r\nPOST /other", {}),
    ("/a b", {}),
    ("/hooks", {"X-Event": "ping\r\nX-Smuggled: 1"}),
    ("/hooks", {"X-Event": "ping\n"}),
])
def test_a_request_line_or_header_that_would_split_the_request_is_refused_unsent(serve_raw, request_target, headers):
    server = serve_raw(lambda conn, server: server.notes.append(read_request(conn)))
    tgt = dataclasses.replace(target(server.port), request_target=request_target)
    with pytest.raises(ValueError):
        Transport().post(tgt, BODY, {**HEADERS, **headers}, Deadline(PATIENCE))
    assert server.accepted == 0


@pytest.mark.parametrize("reply, received, detail", [
    (b"Content-Length: 100\r\n\r\nab", "ab", "connection closed mid-body: 2 of 100 bytes received"),
    (b"Transfer-Encoding: chunked\r\n\r\n10\r\nabc", "abc", "connection closed mid-body (a chunk cut short)"),
])
def test_a_body_cut_short_says_how_much_came(serve_raw, reply, received, detail):
    def cut(conn, server):
        read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\n" + reply)

    result = post(target(serve_raw(cut).port))

    assert (result.ok, result.http_status, result.error, result.response_excerpt, result.error_detail) == (
        False, 200, "connection_error", received, detail)


def test_a_reply_that_is_not_http_says_so(serve_raw):
    def garbage(conn, server):
        read_request(conn)
        conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")

    result = post(target(serve_raw(garbage).port))

    assert (result.error, result.error_detail) == (
        "connection_error", "the receiver sent an invalid status line (BadStatusLine)")


@pytest.mark.parametrize(("error", "detail"), [
    (OSError(errno.ENETUNREACH, "Network is unreachable"), "network unreachable to 192.0.2.7 port 443"),
    (OSError(errno.EHOSTUNREACH, "No route to host"), "host unreachable to 192.0.2.7 port 443"),
    (OSError(errno.EACCES, "Permission denied"), "Permission denied while connecting"),
])
def test_a_network_that_cannot_be_reached_is_named(error, detail):
    """No packet leaves: the errors a kernel raises for a network or host it has no route to."""
    assert causes.of_failure(error, "connect", "192.0.2.7", 443) == detail


def test_a_detail_is_one_clean_line_of_at_most_200_characters():
    assert causes.bounded("a\tb\n\x00c " + "x" * 300) == "a b \ufffdc " + "x" * 192 + "…"


def test_a_silent_server_times_out_at_the_deadline(serve_raw):
    server = serve_raw(lambda conn, server: server.stopped.wait())

    result, elapsed = timed_post(target(server.port))

    assert (result.http_status, result.error) == (None, "timeout")
    assert result.error_detail == f"deadline of {TIMEOUT:g} s reached while waiting for the response head"
    assert TIMEOUT <= elapsed < TIMEOUT + MARGIN


def test_a_dripped_status_line_times_out_at_the_deadline(serve_raw):
    status_and_endless_headers = b"HTTP/1.1 200 OK\r\n" + b"X-Slow: y\r\n" * 100
    server = serve_raw(lambda conn, server: drip_bytes(conn, server, status_and_endless_headers))

    result, elapsed = timed_post(target(server.port))

    assert (result.http_status, result.error) == (None, "timeout")
    assert TIMEOUT <= elapsed < TIMEOUT + MARGIN


def test_a_dripped_body_times_out_at_the_deadline_keeping_the_status(serve_raw):
    def headers_then_drip(conn, server):
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
        drip_bytes(conn, server, b"z" * 1000, every=0.02)  # 20 s in all

    server = serve_raw(headers_then_drip)
    result, elapsed = timed_post(target(server.port))

    assert (result.ok, result.http_status, result.error) == (False, 200, "timeout")
    assert result.response_excerpt.startswith("zzz")
    assert re.fullmatch(rf"deadline of {TIMEOUT:g} s reached while reading the response body \([0-9]+ bytes received\)",
                        result.error_detail)
    assert TIMEOUT <= elapsed < TIMEOUT + MARGIN


def test_a_server_too_busy_to_accept_times_out_at_the_deadline():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        queued = []  # fill the accept queue until the kernel drops new SYNs
        for _ in range(4):
            probe = socket.socket()
            probe.settimeout(0.2)
            queued.append(probe)
            try:
                probe.connect(("127.0.0.1", port))
            except TimeoutError:
                break
        else:
            pytest.skip("this kernel never stalls connect on a full backlog")

        result, elapsed = timed_post(target(port))

        for probe in queued:
            probe.close()
    assert (result.http_status, result.error) == (None, "timeout")
    assert result.error_detail == f"deadline of {TIMEOUT:g} s reached while connecting"
    assert TIMEOUT <= elapsed < TIMEOUT + MARGIN


# --- pinning, headers, proxies ---------------------------------------------------------


def test_connects_to_the_vetted_address_and_sends_the_host_name(receiver):
    result = post(target(receiver.port, host=HOOK_HOST))

    assert result.ok
    assert receiver.received[0].path == "/hooks?a=1"
    assert dict(receiver.received[0].headers)["Host"] == f"{HOOK_HOST}:{receiver.port}"


def test_sends_exactly_the_given_headers_plus_framing(receiver):
    post(target(receiver.port, host=HOOK_HOST))

    framing = {
        "Host": f"{HOOK_HOST}:{receiver.port}",
        "Content-Length": str(len(BODY)),
        "Accept-Encoding": "identity",
    }
    assert sorted(receiver.received[0].headers) == sorted({**HEADERS, **framing}.items())


def test_falls_back_to_the_next_address_when_one_refuses(receiver):
    first_refuses = target(receiver.port, host=HOOK_HOST, addresses=("127.0.0.2", "127.0.0.1"))

    result = post(first_refuses)

    assert result.ok
    assert len(receiver.received) == 1


def test_ipv6_addresses_work(serve):
    try:
        receiver = serve(host="::1")
    except OSError:
        pytest.skip("no IPv6 loopback here")

    result = post(target(receiver.port, host="::1", addresses=("::1",)))

    assert result.ok
    assert dict(receiver.received[0].headers)["Host"] == f"[::1]:{receiver.port}"


def test_an_address_that_is_not_an_ip_is_refused_before_any_lookup(receiver):
    with pytest.raises(ValueError):
        post(target(receiver.port, addresses=(HOOK_HOST,)))


def test_proxy_variables_are_ignored(receiver, monkeypatch):
    with socket.create_server(("127.0.0.1", 0)) as proxy:
        proxy_url = f"http://127.0.0.1:{proxy.getsockname()[1]}"
        for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
            monkeypatch.setenv(name, proxy_url)
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)

        result = post(target(receiver.port, host=HOOK_HOST))

        proxy.setblocking(False)
        with pytest.raises(BlockingIOError):
            proxy.accept()
    assert result.ok
    assert len(receiver.received) == 1


# --- TLS -------------------------------------------------------------------------------


@pytest.fixture
def tls_receiver(serve, server_tls) -> Receiver:
    return serve(tls=server_tls)


@pytest.fixture
def tls_transport(ca_bundle) -> Iterator[Transport]:
    """A transport trusting the test CA, as PARTNER_DELIVERY_CA_BUNDLE configures it."""
    transport = Transport(ca_bundle)
    yield transport
    transport.pools.clear()


def test_tls_verifies_the_certificate_against_the_host_name(tls_receiver, tls_transport):
    tgt = target(tls_receiver.port, host=HOOK_HOST, scheme="https")

    result = post(tgt, transport=tls_transport)

    assert (result.ok, result.http_status) == (True, 200)
    assert dict(tls_receiver.received[0].headers)["Host"] == f"{HOOK_HOST}:{tls_receiver.port}"


def test_tls_host_name_mismatch_is_a_tls_error(tls_receiver, tls_transport):
    tgt = target(tls_receiver.port, host="other.example.test", scheme="https")

    result = post(tgt, transport=tls_transport)

    assert (result.ok, result.http_status, result.error) == (False, None, "tls_error")
    assert result.error_detail == ("certificate verify failed: Hostname mismatch, certificate is not valid "
                                   "for 'other.example.test'.")
    assert tls_receiver.received == []


def test_an_expired_certificate_is_a_tls_error_that_says_so(serve, tls_ca, tls_transport):
    expired = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls_ca.issue_cert(HOOK_HOST, not_before=datetime(2020, 1, 1),
                      not_after=datetime(2021, 1, 1)).configure_cert(expired)

    result = post(target(serve(tls=expired).port, host=HOOK_HOST, scheme="https"), transport=tls_transport)

    assert (result.error, result.error_detail) == ("tls_error", "certificate verify failed: certificate has expired")


def test_a_handshake_that_never_ends_times_out_naming_it(serve_raw, tls_transport):
    server = serve_raw(lambda conn, server: server.stopped.wait())

    result = post(target(server.port, host=HOOK_HOST, scheme="https"), TIMEOUT, tls_transport)

    assert (result.error, result.error_detail) == ("timeout",
                                                   f"deadline of {TIMEOUT:g} s reached during the TLS handshake")


def test_tls_to_a_plain_http_server_says_what_the_handshake_found(receiver, tls_transport):
    result = post(target(receiver.port, host=HOOK_HOST, scheme="https"), transport=tls_transport)

    assert (result.error, result.error_detail) == ("tls_error", "TLS handshake failed: wrong version number")


def test_a_dripped_body_over_tls_times_out_at_the_deadline(serve_raw, server_tls, tls_transport):
    def headers_then_drip(conn, server):
        conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
        drip_bytes(conn, server, b"z" * 1000)

    server = serve_raw(headers_then_drip, tls=server_tls)
    result, elapsed = timed_post(target(server.port, host=HOOK_HOST, scheme="https"),
                                 transport=tls_transport)

    assert (result.http_status, result.error) == (200, "timeout")
    assert TIMEOUT <= elapsed < TIMEOUT + MARGIN


def test_tls_untrusted_certificate_is_a_tls_error(tls_receiver):
    result = post(target(tls_receiver.port, host=HOOK_HOST, scheme="https"))

    assert (result.ok, result.http_status, result.error) == (False, None, "tls_error")
    assert result.error_detail == "certificate verify failed: unable to get local issuer certificate"


# --- resources -------------------------------------------------------------------------


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_fifty_attempts_leak_no_sockets(serve, tls_receiver, tls_transport, serve_raw):
    plain = serve()
    redirecting = serve()
    redirecting.reply = (301, {"Location": "/elsewhere"}, b"moved")
    silent = serve_raw(lambda conn, server: server.stopped.wait())
    attempts = [
        (target(plain.port), 1.0),
        (target(redirecting.port), 1.0),
        (target(tls_receiver.port, host=HOOK_HOST, scheme="https"), 1.0),
        (target(refused_port()), 1.0),
        (target(tls_receiver.port, host=HOOK_HOST, scheme="https"), 1.0),  # ok with the CA below
    ]
    post(target(plain.port))  # warm up lazy imports and caches
    gc.collect()
    before = open_fds()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        for index in range(50):
            tgt, timeout = attempts[index % len(attempts)]
            post(tgt, timeout, tls_transport if index % 5 == 4 else None)
        post(target(silent.port), 0.1)
        gc.collect()

    assert [w for w in caught if issubclass(w.category, ResourceWarning)] == []
    assert open_fds() - before < 5


# --- keep-alive: connections reused between attempts -------------------------------------


def test_a_connection_is_reused_between_two_attempts_to_the_same_target(tls_receiver, tls_transport):
    tgt = target(tls_receiver.port, host=HOOK_HOST, scheme="https")

    first, second = post(tgt, transport=tls_transport), post(tgt, transport=tls_transport)

    assert (first.ok, second.ok) == (True, True)
    assert len(tls_receiver.received) == 2
    assert tls_receiver.connections == 1


def test_a_different_vetted_address_never_reuses_a_connection(tls_receiver, tls_transport):
    port = tls_receiver.port
    assert post(target(port, HOOK_HOST, ("127.0.0.1",), "https"), transport=tls_transport).ok

    elsewhere = post(target(port, HOOK_HOST, ("127.0.0.2",), "https"), transport=tls_transport)

    # 127.0.0.2 was dialled, and nothing listens there: the idle connection to 127.0.0.1 was not used.
    assert (elsewhere.ok, elsewhere.error) == (False, "connection_error")
    assert (tls_receiver.connections, len(tls_receiver.received)) == (1, 1)
    assert post(target(port, HOOK_HOST, ("127.0.0.1",), "https"), transport=tls_transport).ok
    assert tls_receiver.connections == 1  # the first connection was kept for its own address


def test_a_different_host_name_never_reuses_a_connection(serve, tls_receiver, tls_transport):
    assert post(target(tls_receiver.port, host=HOOK_HOST, scheme="https"), transport=tls_transport).ok

    other = post(target(tls_receiver.port, host="other.example.test", scheme="https"), transport=tls_transport)

    assert (other.ok, other.error) == (False, "tls_error")  # a new handshake, for the other name
    assert tls_receiver.connections == 2


def test_a_connection_the_partner_closed_while_idle_is_not_used(serve_raw, server_tls, tls_transport):
    def answer_then_close_soon(conn, server):
        if read_request(conn) is not None:
            conn.sendall(OK_KEEP_ALIVE)
            server.stopped.wait(0.05)  # a short keep-alive timeout, like Node.js's 5 s
            conn.close()
            server.notes.append("closed")

    server = serve_raw(answer_then_close_soon, tls=server_tls)
    tgt = target(server.port, host=HOOK_HOST, scheme="https")
    assert post(tgt, transport=tls_transport).ok
    assert eventually(lambda: server.notes)

    result = post(tgt, transport=tls_transport)

    assert (result.ok, result.http_status) == (True, 200)
    assert server.accepted == 2


def test_a_reused_connection_closed_as_the_request_goes_out_is_retried_once_fresh(
        serve_raw, server_tls, tls_transport):
    # The partner reads the second request on the kept connection and hangs up without a word: the
    # race between its idle timeout and our request that no check before use can rule out.
    server = serve_raw(keep_alive_then(lambda conn, server: None), tls=server_tls)
    tgt = target(server.port, host=HOOK_HOST, scheme="https")
    assert post(tgt, transport=tls_transport).ok

    result = post(tgt, transport=tls_transport)

    assert (result.ok, result.http_status) == (True, 200)
    assert server.accepted == 2


def test_a_fresh_connection_closed_without_an_answer_is_not_retried(serve_raw):
    def hang_up(conn, server):
        read_request(conn)
        server.notes.append("request")

    server = serve_raw(hang_up)

    result = post(target(server.port))

    assert (result.ok, result.error) == (False, "connection_error")
    assert result.error_detail == "connection closed by the receiver without a response"
    assert server.accepted == 1


def test_the_deadline_cuts_a_dripped_body_on_a_reused_connection(serve_raw, server_tls, tls_transport):
    def headers_then_drip(conn, server):
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
        drip_bytes(conn, server, b"z" * 1000, every=0.02)  # 20 s in all

    server = serve_raw(keep_alive_then(headers_then_drip), tls=server_tls)
    tgt = target(server.port, host=HOOK_HOST, scheme="https")
    assert post(tgt, transport=tls_transport).ok  # its deadline is seconds after the next one's

    result, elapsed = timed_post(tgt, transport=tls_transport)

    assert (result.http_status, result.error) == (200, "timeout")
    assert result.response_excerpt.startswith("zzz")
    assert TIMEOUT <= elapsed < TIMEOUT + MARGIN
    assert server.accepted == 1


def test_a_target_keeps_at_most_connections_per_target_idle(serve_raw):
    together = threading.Barrier(2)

    def answer_in_pairs(conn, server):  # two requests in flight at once, so two connections
        while read_request(conn) is not None:
            together.wait(30)
            conn.sendall(OK_KEEP_ALIVE)

    server = serve_raw(answer_in_pairs)
    transport = Transport(connections_per_target=1)
    try:
        for _ in range(2):
            with ThreadPoolExecutor(2) as threads:
                assert all(threads.map(lambda _: post(target(server.port), transport=transport).ok, range(2)))
    finally:
        transport.pools.clear()
    assert server.accepted == 3  # the second pair found one connection kept, and dialled one
