"""A publisher's Idempotency-Key (CONTRACT §11): the same key sent again within 24 hours gets the
first answer, and nothing is queued twice.

A key is reserved in a short transaction of its own before the publish, so that a second request
with it, arriving while the first is answered (in this process or another service), sees it and is
told to wait (409 idempotency_in_progress). The answer is kept in the publish's own transaction, so
a key is remembered exactly when its events are queued; a refused publish gives its key back. A
reservation whose process died before either is taken over after IN_PROGRESS_MS."""

import hashlib
import json

from partner.errors import ApiError
from partner.store.sql import run_sql, select_rows, write_transaction

REMEMBER_MS = 24 * 3600 * 1000
IN_PROGRESS_MS = 60_000  # longer than any publish takes: a reservation this old was abandoned
MAX_KEY_LENGTH = 255

_RESERVE = ("INSERT INTO idempotency_key (publisher_id, key, request_hash, response, created_at) "
            "VALUES (:publisher_id, :key, :request_hash, NULL, :now_ms) ON CONFLICT (publisher_id, key) DO NOTHING")
_THE_KEY = "publisher_id = :publisher_id AND key = :key"
_FOUND = f"SELECT request_hash, response, created_at FROM idempotency_key WHERE {_THE_KEY}"
_TAKE_OVER = ("UPDATE idempotency_key SET request_hash = :request_hash, response = NULL, created_at = :now_ms "
              f"WHERE {_THE_KEY} AND created_at = :reserved_at")
_KEEP = f"UPDATE idempotency_key SET response = :response WHERE {_THE_KEY}"
_GIVE_BACK = f"DELETE FROM idempotency_key WHERE {_THE_KEY} AND response IS NULL"
_FORGET = "DELETE FROM idempotency_key WHERE created_at < :before_ms"


def check_key(key: str) -> str:
    """1–255 printable ASCII characters, or 400."""
    if not 1 <= len(key) <= MAX_KEY_LENGTH or not all(" " <= c <= "~" for c in key):
        raise ApiError(400, "invalid_idempotency_key",
                       f"The Idempotency-Key header is 1-{MAX_KEY_LENGTH} printable ASCII characters.")
    return key


def request_hash(body) -> str:
    """The request's JSON value, hashed: key order and spacing do not count."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def reserve(publisher_id: str, key: str, digest: str, now_ms: int) -> str | None:
    """Reserve `key` for this request; or the answer remembered for it (a replay). 409 if it is being
    answered, or was used with another body."""
    the_key = {"publisher_id": publisher_id, "key": key}
    reserving = {**the_key, "request_hash": digest, "now_ms": now_ms}
    with write_transaction():
        if run_sql(_RESERVE, reserving).rowcount:
            return None
        [found] = select_rows(_FOUND, the_key)
        stale = now_ms - found["created_at"] > (IN_PROGRESS_MS if found["response"] is None else REMEMBER_MS)
        if stale and run_sql(_TAKE_OVER, {**reserving, "reserved_at": found["created_at"]}).rowcount:
            return None
    if found["response"] is None:
        raise ApiError(409, "idempotency_in_progress",
                       "A request with this Idempotency-Key is being answered; send it again in a moment.",
                       headers={"Retry-After": "1"})
    if found["request_hash"] != digest:
        raise ApiError(409, "idempotency_conflict",
                       "This Idempotency-Key was used with a different request body in the last 24 hours.")
    return found["response"]


def keep(publisher_id: str, key: str, answer: str) -> None:
    """Remember the answer; inside the publish's transaction."""
    run_sql(_KEEP, {"response": answer, "publisher_id": publisher_id, "key": key})


def give_back(publisher_id: str, key: str) -> None:
    """A refused request's key may be sent again."""
    with write_transaction(durable=False):
        run_sql(_GIVE_BACK, {"publisher_id": publisher_id, "key": key})


def forget_old(now_ms: int) -> int:
    """Forget keys older than 24 hours (the retention job); how many."""
    with write_transaction(durable=False):
        return run_sql(_FORGET, {"before_ms": now_ms - REMEMBER_MS}).rowcount
