"""Keyset pagination with opaque cursors, shared by every list endpoint.

A cursor stands for a position in one listing of one organization: the time and id of the last row
shown. Release 1.2 signed that position and sent it as base64 JSON, so anyone could read the
internal organization id, row ids and times in it, and it was good forever. A cursor is now opaque
in fact, bound, and short-lived:

- Opaque: the issue time and the position are encrypted with AES-256-GCM under a key derived (HKDF)
  from the cursor key kept in the database; a cursor is the nonce and the ciphertext, base64url.
  No decoding of it shows an id, a slug or a time.
- Bound: the organization and the listing (`subscriptions`, or `failures:<subscription id>`) are the
  associated data: authenticated, never sent. A cursor replayed to another organization or another
  listing fails authentication exactly as a forged or damaged one does.
- Short-lived: it expires CURSOR_LIFETIME_MS after it was issued, by the service's clock (the CLOCK
  setting); the time is inside, so no server state is kept per cursor.

Every refusal is the same None, which the caller answers with 422 `invalid_cursor`: whatever the
text, no cursor reaches a query unless it decrypts and its position has the shape a list query
takes (a time in milliseconds and an id as issued). One that decrypts with a wrong shape could only
come from someone holding the key, and is refused all the same rather than reaching the database.
Cursors of release 1.2 are refused (422): a partner starts the listing again.
"""

import base64
import binascii
import re
import secrets
import struct

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from models import Setting
from partner.store.connection import db
from partner.store.migrations import CURSOR_KEY, add_cursor_key
from partner.store.sql import write_transaction
from partner.errors import ValidationError, field_error
from partner.timestamps import now_ms

DEFAULT_LIMIT = 20
MAX_LIMIT = 100
CURSOR_LIFETIME_MS = 24 * 3600 * 1000
# The derived key's purpose and format: a later format derives another key, and refuses these.
_KEY_INFO = b"partner cursor v2: AES-256-GCM (issued_at, position time, position id)"
_NONCE_BYTES, _TAG_BYTES = 12, 16
_TIMES = struct.Struct(">qq")  # issued at, the position's time: Unix milliseconds
_ID = re.compile(rb"[!-~]{1,128}")  # printable ASCII: new_id's ids and more, never a NUL or a control
_BASE64URL = re.compile(r"[A-Za-z0-9_-]{1,400}")


def cursor_key() -> bytes:
    """The service-wide key that seals cursors, made with the schema (migrations.add_cursor_key), or
    here if it is missing."""
    row = Setting.get_or_none(Setting.name == CURSOR_KEY)
    if row is None:
        with write_transaction():
            add_cursor_key(db)
        row = Setting.get_by_id(CURSOR_KEY)
    return bytes.fromhex(row.value)


class Cursors:
    """Issues and reads cursors with the key derived from `key` (cursor_key), timed by `clock`."""

    def __init__(self, key: bytes, clock) -> None:
        derived = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_KEY_INFO).derive(key)
        self._cipher = AESGCM(derived)
        self._clock = clock

    def issue(self, organization_id: str, listing: str, position: list | None) -> str | None:
        """The cursor for `position` ([time ms, id]) in the organization's `listing`; None for none."""
        if position is None:
            return None
        time_ms, row_id = position
        return self._seal(organization_id, listing,
                          _TIMES.pack(now_ms(self._clock), time_ms) + row_id.encode("ascii"))

    def read(self, organization_id: str, listing: str, cursor: str) -> list | None:
        """The position a cursor stands for, or None: not issued for this organization and listing,
        expired, or not a cursor at all."""
        plaintext = self._open(organization_id, listing, cursor)
        return None if plaintext is None else self._position(plaintext)

    def _seal(self, organization_id: str, listing: str, plaintext: bytes) -> str:
        nonce = secrets.token_bytes(_NONCE_BYTES)
        sealed = self._cipher.encrypt(nonce, plaintext, _binding(organization_id, listing))
        return base64.urlsafe_b64encode(nonce + sealed).rstrip(b"=").decode("ascii")

    def _open(self, organization_id: str, listing: str, cursor: str) -> bytes | None:
        sealed = _unb64(cursor)
        if sealed is None or len(sealed) < _NONCE_BYTES + _TAG_BYTES:
            return None
        try:
            return self._cipher.decrypt(sealed[:_NONCE_BYTES], sealed[_NONCE_BYTES:],
                                        _binding(organization_id, listing))
        except InvalidTag:
            return None

    def _position(self, plaintext: bytes) -> list | None:
        if len(plaintext) <= _TIMES.size or not _ID.fullmatch(plaintext[_TIMES.size:]):
            return None
        issued_at, time_ms = _TIMES.unpack_from(plaintext)
        if time_ms < 0 or now_ms(self._clock) - issued_at > CURSOR_LIFETIME_MS:
            return None
        return [time_ms, plaintext[_TIMES.size:].decode("ascii")]


def read_page_args(args, cursors: Cursors, organization_id: str, listing: str) -> tuple[int, list | None]:
    """Parse `limit` and `cursor` from query args; one 422 naming every bad one."""
    errors = []
    limit = _parse_limit(args.get("limit"))
    if limit is None:
        errors.append(field_error("limit", "out_of_range",
                                  f"limit must be an integer from 1 to {MAX_LIMIT}."))
    position = None
    if args.get("cursor") is not None:
        position = cursors.read(organization_id, listing, args["cursor"])
        if position is None:
            errors.append(field_error("cursor", "invalid_cursor",
                                      "This cursor was not issued for this list, or has expired."))
    if errors:
        raise ValidationError(errors)
    return limit, position


def _binding(organization_id: str, listing: str) -> bytes:
    # NUL cannot occur in either (ids are new_id's), so no two pairs give the same bytes.
    return f"{organization_id}\0{listing}".encode()


def _parse_limit(raw: str | None) -> int | None:
    if raw is None:
        return DEFAULT_LIMIT
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 3):
        return None
    limit = int(raw)
    return limit if 1 <= limit <= MAX_LIMIT else None


def _unb64(text: str) -> bytes | None:
    """The bytes of unpadded base64url `text` as issue() writes it, or None. One spelling only:
    lenient decoding ignores the last character's spare bits, and another spelling of a cursor is
    not a cursor that was issued."""
    if not _BASE64URL.fullmatch(text):
        return None
    try:
        data = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        return None
    return data if base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii") == text else None
