"""Sign and verify webhook deliveries, in both schemes the service sends on every delivery:

- X-VC-*: `X-VC-Signature: sha256=<hex>`, HMAC-SHA256 over "<X-VC-Timestamp (ms)>.<raw body>", keyed by
  the whole secret string;
- Standard Webhooks (https://www.standardwebhooks.com): `webhook-signature: v1,<base64>`, HMAC-SHA256
  over "<webhook-id>.<webhook-timestamp (s)>.<raw body>", keyed by the secret after `whsec_`,
  base64-decoded.

Standard library only and free of project imports, so a partner can copy this
file beside their receiver unchanged.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from collections.abc import Callable, Iterable, Mapping
from typing import NamedTuple

__all__ = [
    "DEFAULT_TOLERANCE_MS",
    "DEFAULT_TOLERANCE_S",
    "SIGNATURE_HEADER",
    "STANDARD_ID_HEADER",
    "STANDARD_SIGNATURE_HEADER",
    "STANDARD_TIMESTAMP_HEADER",
    "TIMESTAMP_HEADER",
    "SignatureError",
    "sign",
    "sign_standard",
    "signature_headers",
    "standard_key",
    "verify",
    "verify_standard",
]

SIGNATURE_HEADER = "X-VC-Signature"
TIMESTAMP_HEADER = "X-VC-Timestamp"
DEFAULT_TOLERANCE_MS = 300_000
STANDARD_ID_HEADER = "webhook-id"
STANDARD_TIMESTAMP_HEADER = "webhook-timestamp"
STANDARD_SIGNATURE_HEADER = "webhook-signature"
DEFAULT_TOLERANCE_S = 300

_SECRET_PREFIX = "whsec_"
_X_VC_PREFIX = "sha256="
_STANDARD_PREFIX = "v1,"
_URLSAFE_TO_STANDARD = str.maketrans("-_", "+/")
# Enough for any 64-bit millisecond clock, and far below the length at which
# int() gets slow or hits CPython's digit limit.
_MAX_TIMESTAMP_DIGITS = 20


class SignatureError(Exception):
    """A delivery failed verification; `reason` names the failed check."""

    # reason, in check order: "missing_header", "duplicate_header", "bad_scheme",
    # "bad_timestamp", "timestamp_out_of_window", "signature_mismatch"; or
    # "invalid_input" when an argument has the wrong type, or a secret has no Standard
    # Webhooks key (a caller's bug).
    reason: str

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def sign(secret: str, timestamp_ms: int | str, body: bytes) -> str:
    """Return 'sha256=<hex>', the HMAC-SHA256 of '<timestamp>.<body>' keyed by secret."""
    return _X_VC_PREFIX + _hmac(secret.encode("utf-8"), f"{timestamp_ms}.", body).hexdigest()


def sign_standard(secret: str, message_id: str, timestamp_s: int | str, body: bytes) -> str:
    """Return 'v1,<base64>', the HMAC-SHA256 of '<message_id>.<timestamp>.<body>' keyed by
    standard_key(secret): the Standard Webhooks signature."""
    digest = _hmac(standard_key(secret), f"{message_id}.{timestamp_s}.", body).digest()
    return _STANDARD_PREFIX + base64.b64encode(digest).decode("ascii")


def standard_key(secret: str) -> bytes:
    """The Standard Webhooks key of a secret: the text after 'whsec_', base64-decoded. Either
    alphabet, padding optional, so that secrets issued before release 1.4 (base64url, unpadded)
    decode too; ValueError unless that gives a non-empty key."""
    text = secret.removeprefix(_SECRET_PREFIX).translate(_URLSAFE_TO_STANDARD)
    key = base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    if not key:  # anyone can compute a signature under an empty key
        raise ValueError("no key after whsec_")
    return key


def signature_headers(secret: str, event_id: str, body: bytes, now_ms: int | None = None) -> dict[str, str]:
    """Every signature header of one delivery attempt, X-VC-* and Standard Webhooks, both at one
    fresh instant (now_ms injectable)."""
    timestamp_ms = _now_ms() if now_ms is None else now_ms
    timestamp_s = timestamp_ms // 1000
    return {
        SIGNATURE_HEADER: sign(secret, timestamp_ms, body),
        TIMESTAMP_HEADER: str(timestamp_ms),
        STANDARD_ID_HEADER: event_id,
        STANDARD_TIMESTAMP_HEADER: str(timestamp_s),
        STANDARD_SIGNATURE_HEADER: sign_standard(secret, event_id, timestamp_s, body),
    }


def verify(headers: Mapping[str, str], body: bytes, secrets: str | Iterable[str], now_ms: int | None = None,
           tolerance_ms: int = DEFAULT_TOLERANCE_MS) -> bytes:
    """Return body if the X-VC-* headers carry a valid, fresh signature of it, else raise
    SignatureError: the spec's five checks, in order."""
    return _verify(_X_VC, headers, body, secrets, _now_ms() if now_ms is None else now_ms, tolerance_ms)


def verify_standard(headers: Mapping[str, str], body: bytes, secrets: str | Iterable[str],
                    now_s: int | None = None, tolerance_s: int = DEFAULT_TOLERANCE_S) -> bytes:
    """Return body if the Standard Webhooks headers (webhook-id, webhook-timestamp in seconds,
    webhook-signature) carry a valid, fresh signature of it, else raise SignatureError: the same
    five checks, in the same order (a secret that is not base64 is "invalid_input")."""
    return _verify(_STANDARD, headers, body, secrets, _now_ms() // 1000 if now_s is None else now_s, tolerance_s)


class _Scheme(NamedTuple):
    """What differs between the two schemes; their checks are the same."""

    headers: tuple[str, ...]  # the signature, the timestamp, then any other header it signs
    prefix: str  # of every signature value
    sign: Callable[..., str]  # (secret, timestamp, body, *other signed headers) -> a signature value


_X_VC = _Scheme((SIGNATURE_HEADER, TIMESTAMP_HEADER), _X_VC_PREFIX, sign)
_STANDARD = _Scheme((STANDARD_SIGNATURE_HEADER, STANDARD_TIMESTAMP_HEADER, STANDARD_ID_HEADER), _STANDARD_PREFIX,
                    lambda secret, timestamp, body, message_id: sign_standard(secret, message_id, timestamp, body))


def _verify(scheme: _Scheme, headers: Mapping[str, str], body: bytes, secrets: str | Iterable[str],
            now: int, tolerance: int) -> bytes:
    """The five checks of one scheme, with now and tolerance in the unit of its timestamp."""
    try:
        signature_header, timestamp_header, *signed = _read_headers(headers, scheme.headers)
        values = _parse_signature(signature_header, scheme.prefix)
        timestamp = _parse_timestamp(timestamp_header)
        _check_fresh(int(timestamp), now, tolerance)
        if not isinstance(body, (bytes, bytearray, memoryview)):
            # A decoded str is no longer the exact bytes that were signed.
            raise SignatureError("invalid_input")
        expected = [scheme.sign(secret, timestamp, body, *signed) for secret in _candidate_secrets(secrets)]
        _check_digest(values, expected)
        return bytes(body)
    except SignatureError:
        raise
    except Exception as exc:
        # The contract promises one exception type whatever the input; the
        # checks name every failure they foresee, this catches the rest.
        raise SignatureError("invalid_input") from exc


def _read_headers(headers: Mapping[str, str], names: tuple[str, ...]) -> list[object]:
    """Check 1: each header present exactly once, names matched case-insensitively."""
    found: dict[str, list[object]] = {name.lower(): [] for name in names}
    # items() rather than lookups: a plain dict is case-sensitive, werkzeug's
    # Headers iterate as pairs, and http.client keeps repeated headers.
    for name, value in headers.items():
        if isinstance(name, str) and value is not None and name.lower() in found:
            found[name.lower()].append(value)
    if not all(found.values()):
        raise SignatureError("missing_header")
    if any(len(values) > 1 for values in found.values()):
        # Two of any leave it ambiguous which one was signed.
        raise SignatureError("duplicate_header")
    return [values[0] for values in found.values()]


def _parse_signature(header: object, prefix: str) -> list[str]:
    """Check 2: every space-separated value carries the scheme's prefix."""
    values = header.split() if isinstance(header, str) else []
    if not values or not all(value.startswith(prefix) for value in values):
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


def _check_fresh(timestamp: int, now: int, tolerance: int) -> None:
    """Check 4: the timestamp lies within tolerance of now, past or future."""
    if abs(now - timestamp) > tolerance:
        raise SignatureError("timestamp_out_of_window")


def _check_digest(values: list[str], expected: list[str]) -> None:
    """Check 5: some expected signature equals some received value, in constant time."""
    # compare_digest raises on non-ASCII str; such a value cannot be a signature anyway.
    received = [value.encode("ascii") for value in values if value.isascii()]
    matched = False
    for signature in expected:
        for value in received:
            matched |= hmac.compare_digest(signature.encode("ascii"), value)
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


def _hmac(key: bytes, prefix: str, body: bytes) -> hmac.HMAC:
    """The HMAC-SHA256 of prefix (as UTF-8) followed by body."""
    # surrogatepass: a received webhook-id with a lone surrogate is a mismatch, not an error.
    mac = hmac.new(key, prefix.encode("utf-8", "surrogatepass"), hashlib.sha256)
    mac.update(body)
    return mac


def _now_ms() -> int:
    """The wall clock in milliseconds."""
    return time.time_ns() // 1_000_000
