"""Keyset pagination with opaque, tamper-evident cursors, shared by every list endpoint."""

import base64
import binascii
import hashlib
import hmac
import json
import secrets

from models import Setting
from partner.store.sql import write_transaction
from partner.errors import ValidationError, field_error

DEFAULT_LIMIT = 20
MAX_LIMIT = 100
_KEY_SETTING = "cursor_signing_key"


def cursor_key() -> bytes:
    """The service-wide key that signs cursors, generated once and kept in the database: written only
    the first time, so that reading it needs no write lock."""
    row = Setting.get_or_none(Setting.name == _KEY_SETTING)
    if row is None:
        with write_transaction():
            Setting.insert(name=_KEY_SETTING, value=secrets.token_hex(32)).on_conflict_ignore().execute()
        row = Setting.get_by_id(_KEY_SETTING)
    return bytes.fromhex(row.value)


def read_page_args(args, key: bytes, scope: str) -> tuple[int, list | None]:
    """Parse `limit` and `cursor` from query args; one 422 naming every bad one."""
    errors = []
    limit = _parse_limit(args.get("limit"))
    if limit is None:
        errors.append(field_error("limit", "out_of_range",
                                  f"limit must be an integer from 1 to {MAX_LIMIT}."))
    position = None
    if args.get("cursor") is not None:
        position = decode_cursor(key, scope, args["cursor"])
        if position is None:
            errors.append(field_error("cursor", "invalid_cursor",
                                      "This cursor was not issued for this list."))
    if errors:
        raise ValidationError(errors)
    return limit, position


def encode_cursor(key: bytes, scope: str, position: list | None) -> str | None:
    if position is None:
        return None
    payload = _b64(json.dumps([scope, position], separators=(",", ":")).encode())
    return f"{payload}.{_b64(_mac(key, payload))}"


def decode_cursor(key: bytes, scope: str, cursor: str) -> list | None:
    """The position a cursor stands for, or None if it was not issued by us for this `scope`."""
    payload, _, mac = cursor.partition(".")
    # Compare the text, not decoded bytes: lenient base64 decoding ignores trailing bits.
    if not hmac.compare_digest(mac.encode(), _b64(_mac(key, payload)).encode()):
        return None
    try:
        cursor_scope, position = json.loads(_unb64(payload))
    except (ValueError, TypeError, binascii.Error):
        return None
    return position if cursor_scope == scope else None


def _parse_limit(raw: str | None) -> int | None:
    if raw is None:
        return DEFAULT_LIMIT
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 3):
        return None
    limit = int(raw)
    return limit if 1 <= limit <= MAX_LIMIT else None


def _mac(key: bytes, payload: str) -> bytes:
    return hmac.new(key, payload.encode(), hashlib.sha256).digest()[:16]


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
