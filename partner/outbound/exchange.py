"""One HTTP/1.1 POST on a connected socket: the request in one write, the reply read by http.client.

Why not urllib3's urlopen: it cost 160 us of CPU an attempt against this exchange's 90-100 us and
a raw socket exchange's 20 us (docs/performance.md), in layers this needs none of: its own header
dictionaries, Timeout objects, response wrapper and retry bookkeeping. urllib3 still makes,
verifies and keeps the connections (connections.py); the status line, headers and body framing
(Content-Length, chunked, or to the close) are read by the standard library's http.client, with
its limits on a line (64 KiB) and on the headers (100). What is ours is the request's head, built
once and sent with the body in one write, so a receiver wakes once per request.
"""

from __future__ import annotations

import http.client
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field

MAX_RESPONSE_BYTES = 65536
# What RFC 9112 allows in a request target and a field value: visible ASCII (and, in a value,
# spaces and tabs between). A CR or LF would end the line and start a request of the partner's own.
_TARGET = re.compile(r"[!-~]+")
_VALUE = re.compile(r"[!-~]+(?:[ \t]+[!-~]+)*|")


@dataclass
class Reply:
    status: int | None = None
    body: bytearray = field(default_factory=bytearray)  # at most MAX_RESPONSE_BYTES of it
    location: str | None = None  # a redirect's
    retry_after: str | None = None
    address: str | None = None  # the one dialled last (the transport's to set)


def request_head(request_target: str, headers: Mapping[str, str], length: int) -> bytes:
    """The request line and headers of a POST of `length` bytes; ValueError if a target or value
    could not be sent as one line."""
    if not _TARGET.fullmatch(request_target):
        raise ValueError(f"request target {request_target!r} is not one token of visible ASCII")
    lines = [f"POST {request_target} HTTP/1.1"]
    for name, value in headers.items():
        if not _VALUE.fullmatch(value):
            raise ValueError(f"header {name} has a value that is not one line of visible ASCII")
        lines.append(f"{name}: {value}")
    lines.append(f"Content-Length: {length}\r\n\r\n")
    return "\r\n".join(lines).encode("ascii")


def post(sock: socket.socket, head: bytes, body: bytes, reply: Reply) -> bool:
    """Send the request and read the reply into `reply`; whether the connection may carry another
    request (the body was read to its end and the receiver keeps it open). A body cut short raises
    http.client.IncompleteRead."""
    sock.sendall(head + body)
    response = http.client.HTTPResponse(sock, method="POST")
    try:
        response.begin()
        reply.status = response.status
        reply.location, reply.retry_after = response.getheader("Location"), response.getheader("Retry-After")
        ended = _read_capped(response, reply.body)
        # http.client passes over a 100 only: after another 1xx (103 Early Hints, 101) the final
        # answer, or another protocol, may still come on this connection.
        return ended and not response.will_close and response.status >= 200
    finally:
        response.close()


def _read_capped(response: http.client.HTTPResponse, into: bytearray) -> bool:
    """Read the body until it ends or MAX_RESPONSE_BYTES have arrived; True if it ended. read1
    hands over whatever has arrived, so `into` keeps the bytes read before a timeout."""
    while len(into) < MAX_RESPONSE_BYTES:
        chunk = response.read1(MAX_RESPONSE_BYTES - len(into))
        if not chunk:
            if response.length:  # http.client's read1 stops at the close without a word
                raise http.client.IncompleteRead(bytes(into), response.length)
            return True
        into += chunk
    return response.length == 0
