"""Publishing (CONTRACT §11): the platform's events checked, then each fanned out, in one transaction,
to its organization's live, active subscriptions whose filter takes its type: one event stored once,
one delivery per subscription, through the same outbox as every other delivery.

A batch is all or nothing: every event is checked before anything is written. An organization over
its backlog limit is refused (503 backlog_full) without holding up any other. The backlog is counted
on the open-deliveries index up to the limit and no further, and a count is reused for a second
(COUNT_TTL_SECONDS) with what this process queued since, so a steady publisher does not count it at
every publish: the limit may be passed by what other processes queue within that second."""

import json
import logging
import threading
import time
from dataclasses import dataclass

from models import Event
from partner import event_types, idempotency, queue
from partner.envelopes import compact
from partner.errors import ApiError, ValidationError, field_error
from partner.events import new_event_id, queue_events
from partner.keys import SLUG_PATTERN
from partner.store.sql import select_rows, write_transaction
from partner.telemetry import metrics
from partner.timestamps import iso, parse_rfc3339

MAX_BATCH = 500
MAX_EVENT_BYTES = 256 * 1024
RESERVED_PREFIX = "vc."
FIELDS = ("organization", "event", "data", "occurred_at")
COUNT_TTL_SECONDS = 1.0

log = logging.getLogger(__name__)

_SUBSCRIBERS = ("SELECT s.id, s.organization_id, s.events FROM subscription AS s JOIN organization AS o "
                "ON o.id = s.organization_id WHERE o.slug = :slug AND s.active = TRUE AND s.deleted_at IS NULL")
_BACKLOG = (f"SELECT COUNT(*) AS n FROM (SELECT 1 FROM delivery WHERE subscription_id IN "
            f"(SELECT id FROM subscription WHERE organization_id = :organization_id) AND {queue.OPEN} LIMIT :limit) "
            f"AS open")


@dataclass(frozen=True)
class Incoming:
    """One checked event, not yet stored."""
    organization: str
    event: Event


@dataclass(frozen=True)
class Accepted:
    """One queued event: the 202 answer's entry."""
    event: Event
    organization: str
    subscriptions: int

    def json(self) -> dict:
        return {"id": self.event.id, "event": self.event.kind, "organization": self.organization,
                "occurred_at": iso(self.event.occurred_at), "subscriptions": self.subscriptions}


def check_events(items: list, now_ms: int, prefix: str = "") -> list[Incoming]:
    """The events of a request body, checked; one 422 listing every invalid one's errors (each field
    after `prefix`, e.g. `events/3/`), with the registry read once."""
    if not items:
        raise ValidationError([field_error(prefix.rstrip("/") or "events", "required", "At least one event.")])
    registry = event_types.registry()
    errors, checked = [], []
    for index, item in enumerate(items):
        where = f"{prefix}{index}/" if prefix else ""
        problems = _check(item, registry, where)
        errors += problems
        if not problems:
            checked.append(_incoming(item, now_ms))
    if errors:
        raise ValidationError(errors)
    return checked


def _check(item, registry, where: str) -> list[dict]:
    if not isinstance(item, dict):
        return [field_error(where.rstrip("/") or "body", "invalid_type", "An event is a JSON object.")]
    errors = [field_error(f"{where}{name}", "unknown_field", "This field is not accepted.")
              for name in item if name not in FIELDS]
    for name in ("organization", "event"):
        if not isinstance(item.get(name), str) or not item[name]:
            code = "required" if item.get(name) is None else "invalid_type"
            errors.append(field_error(f"{where}{name}", code, "This field is a non-empty string."))
    if isinstance(item.get("organization"), str) and item["organization"] and not SLUG_PATTERN.fullmatch(item["organization"]):
        errors.append(field_error(f"{where}organization", "invalid_type",
                                  "An organization slug: 1-63 of a-z, 0-9 and '-', not starting with '-'."))
    if not isinstance(item.get("data"), dict):
        code = "required" if item.get("data") is None else "invalid_type"
        errors.append(field_error(f"{where}data", code, "This field is a JSON object."))
    occurred_at = item.get("occurred_at")
    if occurred_at is not None and (not isinstance(occurred_at, str) or parse_rfc3339(occurred_at) is None):
        errors.append(field_error(f"{where}occurred_at", "invalid_type",
                                  "An RFC 3339 time with its offset, e.g. 2026-12-05T10:00:00.000Z."))
    if not errors and len(compact(item)) > MAX_EVENT_BYTES:
        raise ApiError(413, "payload_too_large", f"Event {where.rstrip('/') or ''} is over 256 KiB, the most one event may be.")
    if not errors:
        errors += _type_errors(item["event"], item["data"], registry, where)
    return errors


def _type_errors(kind: str, data: dict, registry, where: str) -> list[dict]:
    """The event type's refusal: reserved, unknown, retired, or its schema's first mismatch."""
    if kind.startswith(RESERVED_PREFIX):
        return [field_error(f"{where}event", "reserved_event_type", f"{RESERVED_PREFIX}* types are the service's own.")]
    known = registry.get(kind)
    if known is None:
        return [field_error(f"{where}event", "unknown_event_type", f"No event type {kind!r} is registered.")]
    if known.retired_at is not None:
        return [field_error(f"{where}event", "retired_event_type", f"Event type {kind!r} is retired.")]
    mismatch = known.mismatch(data)
    if mismatch is None:
        return []
    pointer, message = mismatch
    return [field_error(f"{where}data{pointer}", "schema_mismatch", message)]


def _incoming(item: dict, now_ms: int) -> Incoming:
    occurred_at = parse_rfc3339(item["occurred_at"]) if item.get("occurred_at") is not None else now_ms
    return Incoming(item["organization"], Event(id=new_event_id(), kind=item["event"], occurred_at=occurred_at,
                                                data=compact(item["data"]), created_at=now_ms))


def publish(incoming: list[Incoming], now_ms: int, backlog_limit: int, before_commit=None) -> list[Accepted]:
    """Queue each event to its organization's matching subscriptions, all in one transaction; 503
    backlog_full (nothing stored) if an organization already has more than `backlog_limit` open
    deliveries. `before_commit(accepted)` runs inside the transaction (the idempotency key's answer)."""
    subscribers = {slug: select_rows(_SUBSCRIBERS, {"slug": slug}) for slug in {item.organization for item in incoming}}
    fanned = [(item, [row["id"] for row in subscribers[item.organization] if event_types.matches(row["events"], item.event.kind)])
              for item in incoming]
    adding = {}
    for item, subscription_ids in fanned:
        if subscription_ids:
            organization_id = subscribers[item.organization][0]["organization_id"]
            adding[organization_id] = adding.get(organization_id, 0) + len(subscription_ids)
    for organization_id in adding:
        _backlog.check(organization_id, backlog_limit)
    accepted = [Accepted(item.event, item.organization, len(ids)) for item, ids in fanned]
    with write_transaction():
        queue_events([(item.event, ids) for item, ids in fanned], now_ms)
        if before_commit is not None:
            before_commit(accepted)
    for organization_id, count in adding.items():
        _backlog.added(organization_id, count)
    return accepted


def publish_once(publisher_id: str, key: str | None, body: dict, items: list, prefix: str, now_ms: int,
                 backlog_limit: int, shape) -> tuple[str, bool]:
    """A publish request's answer, `shape(accepted)` as JSON text, and whether it is the first answer
    to the same Idempotency-Key replayed (then nothing was queued); `key` None: no key. Refusals
    raise, and give the key back."""
    if key is not None:
        idempotency.check_key(key)
        remembered = idempotency.reserve(publisher_id, key, idempotency.request_hash(body), now_ms)
        if remembered is not None:
            return remembered, True
    answer = []

    def keep(accepted: list[Accepted]) -> None:
        answer.append(json.dumps(shape(accepted), separators=(",", ":"), sort_keys=True))  # as Flask answers JSON
        if key is not None:
            idempotency.keep(publisher_id, key, answer[0])
    try:
        accepted = publish(check_events(items, now_ms, prefix), now_ms, backlog_limit, keep)
    except BaseException:
        if key is not None:
            _give_back(publisher_id, key)
        raise
    metrics.count_published(accepted)
    return answer[0], False


def _give_back(publisher_id: str, key: str) -> None:
    """Free a refused request's key; if the database refuses that too (an outage: the refusal itself),
    the key is free again after idempotency.IN_PROGRESS_MS, and the refusal raised is the first one."""
    try:
        idempotency.give_back(publisher_id, key)
    except Exception as error:  # noqa: BLE001 - the caller raises the refusal that matters
        log.warning("an idempotency key stays reserved until it expires: %s", type(error).__name__)


class _Backlogs:
    """Each organization's open deliveries, counted up to the limit, reused for COUNT_TTL_SECONDS."""

    def __init__(self):
        self._counts: dict[str, tuple[int, float]] = {}
        self._lock = threading.Lock()

    def check(self, organization_id: str, limit: int) -> None:
        """503 backlog_full if the organization already has more than `limit` open deliveries."""
        with self._lock:
            count, at = self._counts.get(organization_id, (0, -COUNT_TTL_SECONDS))
        if time.monotonic() - at >= COUNT_TTL_SECONDS or count > limit:
            [row] = select_rows(_BACKLOG, {"organization_id": organization_id, "limit": limit + 1})
            count = row["n"]
            with self._lock:
                self._counts[organization_id] = (count, time.monotonic())
        if count > limit:
            raise ApiError(503, "backlog_full",
                           f"The organization already has more than {limit} deliveries pending; try again later.",
                           headers={"Retry-After": "30"})

    def added(self, organization_id: str, count: int) -> None:
        with self._lock:
            if organization_id in self._counts:
                queued, at = self._counts[organization_id]
                self._counts[organization_id] = (queued + count, at)


_backlog = _Backlogs()
