"""Publishers: the platform's services that publish events (CONTRACT §11). A credential is
`vcp_<id>.<secret>`, shown once and stored as a hash like an API key's, and never interchangeable with
one: each pattern refuses the other's prefix, so a key is refused here and a credential by the partner API."""

import hmac
import re
import secrets
from dataclasses import dataclass, field

from models import Publisher
from partner.errors import OperatorError
from partner.keys import DUMMY_HASH, KEY_ID_LENGTH, SECRET_BYTES, hash_secret
from partner.store.sql import random_token, select_rows, write_transaction

PREFIX = "vcp_"
CREDENTIAL_PATTERN = re.compile(r"(?:bearer[ \t]+)?vcp_([A-Za-z0-9]{16,64})\.([A-Za-z0-9_-]{43,128})", re.IGNORECASE)
NAME_PATTERN = re.compile(r"[a-z0-9-]{1,64}")
ID_PATTERN = re.compile(r"[A-Za-z0-9]{16,64}")
_LOOKUP = "SELECT id, secret_hash, revoked_at FROM publisher WHERE id = :publisher_id"


@dataclass(frozen=True)
class Caller:
    id: str


@dataclass(frozen=True)
class Issued:
    publisher: Publisher
    credential: str = field(repr=False)  # a repr may reach a log line or a traceback


def create_publisher(name: str, now_ms: int) -> Issued:
    if not NAME_PATTERN.fullmatch(name):
        raise OperatorError("A publisher's name is 1-64 of a-z, 0-9 and '-'.")
    secret = secrets.token_urlsafe(SECRET_BYTES)
    with write_transaction():
        if Publisher.select().where(Publisher.name == name).exists():
            raise OperatorError(f"A publisher named {name!r} exists already.")
        publisher = Publisher.create(id=random_token(KEY_ID_LENGTH), name=name, secret_hash=hash_secret(secret),
                                     created_at=now_ms)
    return Issued(publisher, f"{PREFIX}{publisher.id}.{secret}")


def list_publishers() -> list[Publisher]:
    return list(Publisher.select().order_by(Publisher.created_at, Publisher.id))


def revoke_publisher(publisher_id: str, now_ms: int) -> Publisher:
    if not ID_PATTERN.fullmatch(publisher_id):  # never issued, and PostgreSQL refuses NUL in a query
        raise OperatorError(f"No publisher {publisher_id!r}.")
    with write_transaction():
        Publisher.update(revoked_at=now_ms).where((Publisher.id == publisher_id) & Publisher.revoked_at.is_null()).execute()
        publisher = Publisher.get_or_none(Publisher.id == publisher_id)
    if publisher is None:
        raise OperatorError(f"No publisher {publisher_id!r}.")
    return publisher


def authenticate_publisher(header: str | None) -> Caller | None:
    """The publisher whose active credential the Authorization header carries (`Bearer vcp_…`, or the
    bare credential); None otherwise. An unknown id costs what a wrong secret does."""
    match = CREDENTIAL_PATTERN.fullmatch(header.strip()) if header else None
    if match is None:
        return None
    rows = select_rows(_LOOKUP, {"publisher_id": match[1]})
    row = rows[0] if rows else None
    if not hmac.compare_digest(row["secret_hash"] if row else DUMMY_HASH, hash_secret(match[2])):
        return None
    return Caller(row["id"]) if row is not None and row["revoked_at"] is None else None
