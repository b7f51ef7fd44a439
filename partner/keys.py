"""API keys and organizations: the key format, the scope table, and the operator's operations."""

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass, field

from models import ApiKey, Organization
from partner.store.sql import is_sqlite, new_id, random_token, select_rows, write_transaction
from partner.errors import OperatorError, ValidationError, field_error

KEY_PREFIX = "vck_"
KEY_ID_LENGTH = 20
SECRET_BYTES = 32
DEFAULT_RATE_LIMIT = 600
# Requests per minute an organization may be given: ~16,700 a second, past what one service answers.
MAX_RATE_LIMIT = 1_000_000

# `vck_<key_id>.<secret>`: key id alphanumeric; secret base64url without padding (never a dot).
KEY_PATTERN = re.compile(r"vck_([A-Za-z0-9]{16,64})\.([A-Za-z0-9_-]{43,128})")
SLUG_PATTERN = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")

IDENTITY_READ = "identity:read"
WEBHOOKS_MANAGE = "webhooks:manage"
GRANTABLE_SCOPES = frozenset({IDENTITY_READ, WEBHOOKS_MANAGE})
VALID_SCOPES = f"the valid scopes are {', '.join(sorted(GRANTABLE_SCOPES))}"
RESERVED_SCOPES = frozenset({
    "leads:read", "leads:write", "intakes:read", "intakes:write", "records:read", "records:write",
    "skills:read", "skills:author", "skills:execute", "agents:invoke", "tenants:provision",
})

# Hashed when no key matches, so an unknown key id costs the same as a wrong secret.
DUMMY_HASH = hashlib.sha256(b"no such key").hexdigest()


@dataclass(frozen=True, slots=True)
class CallerOrganization:
    id: str
    slug: str
    rate_limit_per_minute: int


@dataclass(frozen=True, slots=True)
class Caller:
    """The key that authenticated a request, and its organization: plain values read once per
    request (peewee models cost more to build and to read, and every request builds one)."""
    key_id: str
    scope_set: frozenset[str]
    organization: CallerOrganization


@dataclass(frozen=True)
class IssuedKey:
    """A freshly created key: the only moment the full key exists outside the caller."""
    key: ApiKey
    full_key: str = field(repr=False)  # a repr may reach a log line or a traceback


def hash_secret(secret: str) -> str:
    # The secret is 256 random bits, so a fast hash is enough: there is nothing to brute-force.
    return hashlib.sha256(secret.encode()).hexdigest()


def parse_key(full_key: str) -> tuple[str, str] | None:
    """Split `vck_<key_id>.<secret>` into its parts, or None when it is not of that form."""
    match = KEY_PATTERN.fullmatch(full_key)
    return (match[1], match[2]) if match else None


def find_active_key(full_key: str) -> Caller | None:
    """The caller of the active key whose id and secret both match. Read from the database on every
    request: a revocation takes effect on the next request, in every process."""
    parts = parse_key(full_key)
    if parts is None:
        return None
    key_id, secret = parts
    rows = select_rows(_KEY_LOOKUP, {"key_id": key_id})
    row = rows[0] if rows else None
    expected = row["secret_hash"] if row else DUMMY_HASH
    if not hmac.compare_digest(expected, hash_secret(secret)) or row is None or row["revoked_at"] is not None:
        return None
    return Caller(row["key_id"], frozenset(row["scopes"].split()),
                  CallerOrganization(row["org_id"], row["slug"], row["rate_limit_per_minute"]))


# Every API request runs this lookup, so it is written once as SQL rather than built by the ORM
# each time (which cost a quarter of a request). Portable: the same text runs on SQLite and PostgreSQL.
_KEY_LOOKUP = ('SELECT k.key_id, k.secret_hash, k.scopes, k.revoked_at, '
               'o.id AS org_id, o.slug, o.rate_limit_per_minute '
               'FROM api_key AS k JOIN organization AS o ON o.id = k.organization_id '
               'WHERE k.key_id = :key_id')


def check_scopes(requested: list[str]) -> list[str]:
    """The sorted scope set of a new key; reserved or unknown scopes are a validation error."""
    errors = []
    for scope in requested:
        if scope in RESERVED_SCOPES:
            errors.append(field_error("scopes", "reserved_scope",
                                      f"Scope {scope!r} is reserved for a future version; {VALID_SCOPES}."))
        elif scope not in GRANTABLE_SCOPES:
            errors.append(field_error("scopes", "unknown_scope", f"Scope {scope!r} does not exist; {VALID_SCOPES}."))
    if errors:
        raise ValidationError(errors)
    return sorted({IDENTITY_READ, *requested})


def check_slug(slug: str) -> str:
    if not SLUG_PATTERN.fullmatch(slug):
        raise ValidationError([field_error(
            "org", "invalid_slug", "An organization slug is 1-63 of a-z, 0-9 and '-', not starting with '-'.")])
    return slug


def create_key(slug: str, scopes: list[str], now_ms: int, rate_limit: int | None = None) -> IssuedKey:
    """Issue a key for the organization `slug`, creating the organization on first use with
    `rate_limit` (default DEFAULT_RATE_LIMIT). An existing organization keeps its limit: another one
    given here is refused, because a key issued for a test must not change every key's budget."""
    scope_list = check_scopes(scopes)
    check_slug(slug)
    with write_transaction():
        # The first key creates the organization; on PostgreSQL a first key issued at the same moment
        # elsewhere may create it first, and this one then joins it (not a unique violation).
        (Organization.insert(id=new_id("org"), slug=slug, created_at=now_ms,
                             rate_limit_per_minute=rate_limit or DEFAULT_RATE_LIMIT)
         .on_conflict_ignore().execute())
        org = Organization.get(Organization.slug == slug)
        if rate_limit is not None and org.rate_limit_per_minute != rate_limit:
            raise OperatorError(
                f"Organization {slug} already has a limit of {org.rate_limit_per_minute} requests per minute, "
                f"shared by all its keys; no key was created. Change it with `flask orgs set-limit {slug} "
                f"{rate_limit}`, or leave out --rate-limit.")
        secret = secrets.token_urlsafe(SECRET_BYTES)
        # Key ids are never reused: the primary key refuses a collision, and revoked rows stay forever.
        key = ApiKey.create(key_id=random_token(KEY_ID_LENGTH), organization=org, secret_hash=hash_secret(secret),
                            scopes=" ".join(scope_list), created_at=now_ms)
    return IssuedKey(key, f"{KEY_PREFIX}{key.key_id}.{secret}")


def revoke_key(key_id: str, now_ms: int) -> ApiKey | None:
    """Revoke a key at once; None when there is no such key. Revoking twice keeps the first time, also
    when another revocation or a rotation of the key commits meanwhile (the update is conditional)."""
    with write_transaction():
        ApiKey.update(revoked_at=now_ms).where((ApiKey.key_id == key_id) & ApiKey.revoked_at.is_null()).execute()
        return ApiKey.get_or_none(ApiKey.key_id == key_id)


def rotate_key(key_id: str, now_ms: int) -> IssuedKey | None:
    """Issue a key with the same organization and scopes, then revoke the old one, atomically."""
    with write_transaction():
        query = ApiKey.select(ApiKey, Organization).join(Organization).where(
            ApiKey.key_id == key_id, ApiKey.revoked_at.is_null())
        # On PostgreSQL a revocation or rotation of this key committing meanwhile is waited for, and
        # seen; on SQLite the write transaction already excludes it.
        if not is_sqlite():
            query = query.for_update("FOR NO KEY UPDATE", of=ApiKey)
        old = query.first()
        if old is None:
            return None
        issued = create_key(old.organization.slug, sorted(old.scope_set), now_ms)
        revoke_key(key_id, now_ms)
    return issued


def list_keys(slug: str | None = None) -> list[ApiKey]:
    query = ApiKey.select(ApiKey, Organization).join(Organization)
    if slug:
        query = query.where(Organization.slug == slug)
    return list(query.order_by(ApiKey.created_at, ApiKey.key_id))
