"""Sign and verify webhook deliveries: HMAC-SHA256 over "<timestamp>.<raw body>".

Standard library only and free of project imports, so a partner can copy this
file beside their receiver unchanged.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Iterable, Mapping

__all__ = [
    "DEFAULT_TOLERANCE_MS",
    "SIGNATURE_HEADER",
    "TIMESTAMP_HEADER",
    "SignatureError",
    "sign",
    "signature_headers",
    "verify",
]

SIGNATURE_HEADER = "X-VC-Signature"
TIMESTAMP_HEADER = "X-VC-Timestamp"
DEFAULT_TOLERANCE_MS = 300_000

_SCHEME = "sha256="
# Enough for any 64-bit millisecond clock, and far below the length at which
# int() gets slow or hits CPython's digit limit.
_MAX_TIMESTAMP_DIGITS = 20


class SignatureError(Exception):
    """A delivery failed verification; `reason` names the failed check."""

    # reason, in check order: "missing_header", "duplicate_header", "bad_scheme",
    # "bad_timestamp", "timestamp_out_of_window", "signature_mismatch"; or
    # "invalid_input" when an argument has the wrong type (a caller's bug).
    reason: str

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def sign(secret: str, timestamp_ms: int | str, body: bytes) -> str:
    """Return 'sha256=<hex>', the HMAC-SHA256 of '<timestamp>.<body>' keyed by secret."""
    mac = hmac.new(secret.encode("utf-8"), digestmod=hashlib.sha256)
    mac.update(f"{timestamp_ms}.".encode("ascii"))
    mac.update(body)
    return _SCHEME + mac.hexdigest()


def signature_headers(secret: str, body: bytes, now_ms: int | None = None) -> dict[str, str]:
    """The two headers for one delivery attempt, with a fresh timestamp (now_ms injectable)."""
    timestamp = str(_now_or(now_ms))
    return {SIGNATURE_HEADER: sign(secret, timestamp, body), TIMESTAMP_HEADER: timestamp}


def verify(headers: Mapping[str, str], body: bytes, secrets: str | Iterable[str], now_ms: int | None = None,
           tolerance_ms: int = DEFAULT_TOLERANCE_MS) -> None:
    """Raise SignatureError unless the headers carry a valid, fresh signature of body: the spec's
    five checks, in order."""
    try:
        signature_header, timestamp_header = _read_headers(headers)
        values = _parse_signature(signature_header)
        timestamp = _parse_timestamp(timestamp_header)
        _check_fresh(int(timestamp), _now_or(now_ms), tolerance_ms)
        _check_digest(values, timestamp, body, _candidate_secrets(secrets))
    except SignatureError:
        raise
    except Exception as exc:
        # The contract promises one exception type whatever the input; the
        # checks name every failure they foresee, this catches the rest.
        raise SignatureError("invalid_input") from exc


def _read_headers(headers: Mapping[str, str]) -> tuple[object, object]:
    """Check 1: each header present exactly once, names matched case-insensitively."""
    signatures: list[object] = []
    timestamps: list[object] = []
    found = {SIGNATURE_HEADER.lower(): signatures, TIMESTAMP_HEADER.lower(): timestamps}
    # items() rather than lookups: a plain dict is case-sensitive, werkzeug's
    # Headers iterate as pairs, and http.client keeps repeated headers.
    for name, value in headers.items():
        if isinstance(name, str) and value is not None and name.lower() in found:
            found[name.lower()].append(value)
    if not signatures or not timestamps:
        raise SignatureError("missing_header")
    if len(signatures) > 1 or len(timestamps) > 1:
        # Two of either leave it ambiguous which one was signed.
        raise SignatureError("duplicate_header")
    return signatures[0], timestamps[0]


def _parse_signature(header: object) -> list[str]:
    """Check 2: every space-separated value carries the sha256 scheme."""
    values = header.split() if isinstance(header, str) else []
    if not values or not all(value.startswith(_SCHEME) for value in values):
        raise SignatureError("bad_scheme")
    return values


def _parse_timestamp(header: object) -> str:
    """Check 3: the timestamp is ASCII digits only; returns the literal, as signed."""
    # int() alone would also take " 12", "+12", "1_2" and "١٢".
    if not (
        isinstance(header, str)
        and 0 < len(header) <= _MAX_TIMESTAMP_DIGITS
        and header.isascii()
        and header.isdigit()
    ):
        raise SignatureError("bad_timestamp")
    return header


def _check_fresh(timestamp_ms: int, now: int, tolerance_ms: int) -> None:
    """Check 4: the timestamp lies within tolerance_ms of now, past or future."""
    if abs(now - timestamp_ms) > tolerance_ms:
        raise SignatureError("timestamp_out_of_window")


def _check_digest(values: list[str], timestamp: str, body: bytes, secrets: list[str]) -> None:
    """Check 5: some secret's digest equals some received value, in constant time."""
    if not isinstance(body, (bytes, bytearray, memoryview)):
        # A decoded str is no longer the exact bytes that were signed.
        raise SignatureError("invalid_input")
    # compare_digest raises on non-ASCII str; such a value cannot be a hex digest anyway.
    received = [value.encode("ascii") for value in values if value.isascii()]
    matched = False
    for secret in secrets:
        expected = sign(secret, timestamp, body).encode("ascii")
        for value in received:
            matched |= hmac.compare_digest(expected, value)
    if not matched:
        raise SignatureError("signature_mismatch")


def _candidate_secrets(secrets: str | Iterable[str]) -> list[str]:
    """One secret or several (rotation); an empty secret never matches."""
    candidates = [secrets] if isinstance(secrets, str) else list(secrets)
    if not all(isinstance(secret, str) for secret in candidates):
        raise SignatureError("invalid_input")
    # An empty key would accept signatures anyone can compute, e.g. when an
    # unset environment variable is passed straight through.
    return [secret for secret in candidates if secret]


def _now_or(now_ms: int | None) -> int:
    """The injected time in milliseconds, or the wall clock's."""
    return time.time_ns() // 1_000_000 if now_ms is None else now_ms
