"""A failed attempt's cause in words: the failure record's `error_detail`, shown to the partner (the
failures audit), to the operator (`flask deliveries show`) and in the attempt's log line.

One plain line of at most MAX_CHARS characters. Built only from what the attempt saw: the exception
urllib3, http.client or the socket raised, the phase it was in, the address dialled, a redirect's
Location. Never the subscription URL (its path or query may carry a partner's token), never a
secret; a Location loses its user-info and its query, which the partner's server chose and may
carry credentials.
"""

from __future__ import annotations

import errno
import http.client
import ssl
from collections.abc import Iterator
from urllib.parse import urlsplit

from partner import safe_text

MAX_CHARS = 200

# Where an attempt was when it failed (connections.attempt.phase), in words.
PHASES = {
    "lookup": "while resolving the host name",
    "connect": "while connecting",
    "TLS handshake": "during the TLS handshake",
    "request": "while sending the request",
    "response head": "while waiting for the response head",
    "body": "while reading the response body",
}
_ERRNOS = {
    errno.ECONNREFUSED: "connection refused",
    errno.ECONNRESET: "connection reset by the receiver",
    errno.ECONNABORTED: "connection aborted",
    errno.EPIPE: "connection closed by the receiver",
    errno.ENETUNREACH: "network unreachable",
    errno.EHOSTUNREACH: "host unreachable",
    errno.EADDRNOTAVAIL: "address not available",
}
_MALFORMED = {
    http.client.BadStatusLine: "an invalid status line",
    http.client.LineTooLong: "a header line too long",
    http.client.HTTPException: "a malformed response",
}


def bounded(text: str) -> str:
    """`text` as one line of clean text of at most MAX_CHARS characters, cut with an ellipsis."""
    line = " ".join(safe_text.clean(text).split())
    return line if len(line) <= MAX_CHARS else line[:MAX_CHARS - 1] + "…"


def of_timeout(seconds: float, phase: str, received: int = 0) -> str:
    """The deadline ran out in `phase` (PHASES); `received`: body bytes that had arrived."""
    detail = f"deadline of {seconds:g} s reached {PHASES[phase]}"
    return bounded(detail + (f" ({received} bytes received)" if phase == "body" else ""))


def of_failure(failure: BaseException, phase: str, address: str | None, port: int) -> str:
    """A connection or TLS failure (not a timeout): what the socket, TLS or HTTP layer said, and when."""
    for cause in chain(failure):
        if isinstance(cause, ssl.SSLCertVerificationError):
            return bounded(f"certificate verify failed: {cause.verify_message or cause.reason}")
        if isinstance(cause, ssl.SSLError):
            reason = (cause.reason or type(cause).__name__).lower().replace("_", " ")
            failed = "TLS handshake failed" if phase == "TLS handshake" else f"TLS error {PHASES[phase]}"
            return bounded(f"{failed}: {reason}")
        if isinstance(cause, http.client.IncompleteRead):
            if not cause.expected:  # a chunked body: http.client knows neither what came nor what was due
                return "connection closed mid-body (a chunk cut short)"
            received = len(cause.partial)
            return bounded(f"connection closed mid-body: {received} of {received + cause.expected} bytes received")
        if isinstance(cause, http.client.RemoteDisconnected):
            return "connection closed by the receiver without a response"
        if isinstance(cause, OSError) and cause.errno in _ERRNOS:
            preposition = "by" if cause.errno == errno.ECONNREFUSED else "to"
            where = f" {preposition} {address} port {port}" if phase == "connect" and address else f" {PHASES[phase]}"
            return bounded(_ERRNOS[cause.errno] + where)
        malformed = next((words for kind, words in _MALFORMED.items() if isinstance(cause, kind)), None)
        if malformed:
            return bounded(f"the receiver sent {malformed} ({type(cause).__name__})")
    innermost = list(chain(failure))[-1]
    words = innermost.strerror if isinstance(innermost, OSError) and innermost.strerror else type(innermost).__name__
    return bounded(f"{words} {PHASES[phase]}")


def of_redirect(status: int, location: str | None) -> str:
    """A 3xx: where it pointed, without user-info or query."""
    if not location:
        return f"{status} without a Location header"
    return bounded(f"{status} to {_without_credentials(location)}")


def _without_credentials(location: str) -> str:
    try:
        parts = urlsplit(location)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:  # a malformed Location: nothing of it can be trusted to be harmless
        return "an unreadable Location"
    if parts.scheme and not parts.netloc:  # opaque (mailto:user:pass@x): what follows the scheme may be a credential
        return f"{parts.scheme}:…"
    shown = parts._replace(netloc=(f"[{host}]" if ":" in host else host) + port if parts.netloc else "",
                           query="…" if parts.query else "", fragment="")
    return shown.geturl()


def chain(failure: BaseException) -> Iterator[BaseException]:
    """The failure and what it wraps: urllib3 raises its own errors around the socket's."""
    seen: BaseException | None = failure
    while seen is not None:
        yield seen
        seen = seen.__cause__ or seen.__context__
