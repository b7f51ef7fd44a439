"""Event types (CONTRACT §11): the operator's registry of what may be published, each with an
optional JSON Schema (draft 2020-12) of its `data`, and the partner's filter of what it receives.

Every publish reads the registry once (one small query), so a type added, changed or retired is seen
at once; a schema's validator is built once per version of it (its name and updated_at) and reused.
A schema never fetches anything: only references inside itself resolve."""

import functools
import json
import re
from dataclasses import dataclass

from jsonschema.exceptions import SchemaError
from referencing import Registry
from referencing.exceptions import Unresolvable

from models import EventType
from partner import safe_text
from partner.bounded_schemas import BoundedValidator, PatternTooSlow
from partner.errors import OperatorError
from partner.store.sql import select_rows, write_transaction

NAME_PATTERN = re.compile(r"[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+")
MAX_NAME_LENGTH = 100
MAX_SCHEMA_BYTES = 64 * 1024
MAX_DESCRIPTION_LENGTH = 500
MAX_FILTER = 50
RESERVED_PREFIX = "vc."
_REGISTRY = "SELECT name, description, schema, updated_at, retired_at FROM event_type ORDER BY name"
_NO_RETRIEVAL = Registry(retrieve=lambda uri: (_ for _ in ()).throw(Unresolvable(uri)))


@dataclass(frozen=True)
class KnownType:
    name: str
    description: str | None
    schema: str | None
    updated_at: int
    retired_at: int | None

    def mismatch(self, data) -> tuple[str, str] | None:
        """The JSON Pointer (`/lead_id`, or `` for data itself) and message of the first place `data`
        breaks the schema; None when it fits or there is no schema."""
        if self.schema is None:
            return None
        try:
            error = next(_validator(self.name, self.updated_at, self.schema).iter_errors(data), None)
        except PatternTooSlow as failure:
            return "", str(failure)
        except (RecursionError, Unresolvable) as failure:
            return "", f"data could not be checked against the schema: {type(failure).__name__}"
        if error is None:
            return None
        pointer = "".join("/" + str(part).replace("~", "~0").replace("/", "~1") for part in error.absolute_path)
        return pointer, error.message[:200]


@functools.lru_cache(maxsize=256)
def _validator(name: str, updated_at: int, schema: str) -> BoundedValidator:
    return BoundedValidator(json.loads(schema), registry=_NO_RETRIEVAL)


def registry() -> dict[str, KnownType]:
    return {row["name"]: KnownType(**row) for row in select_rows(_REGISTRY, {})}


def matches(filter_json: str | None, kind: str) -> bool:
    """Whether a subscription's filter (stored JSON; None: every type) takes `kind`."""
    return filter_json is None or any(_takes(entry, kind) for entry in json.loads(filter_json))


def _takes(entry: str, kind: str) -> bool:
    return kind.startswith(entry[:-1]) if entry.endswith(".*") else kind == entry


def check_filter(entries) -> tuple[str, str] | None:
    """A subscription's `events` as a field check: 1-50 registered, unretired types or `family.*`
    wildcards that match at least one; (code, message) for the first fault."""
    if not isinstance(entries, list) or not all(isinstance(entry, str) for entry in entries):
        return "invalid_type", "This field is a list of event types, or null for every type."
    if not 1 <= len(entries) <= MAX_FILTER:
        return "out_of_range", f"This field lists 1 to {MAX_FILTER} event types."
    live = [name for name, known in registry().items() if known.retired_at is None]
    for entry in entries:
        if not any(_takes(entry, name) for name in live):
            return "unknown_event_type", f"{entry!r} is no registered event type, nor a family.* matching one."
    return None


def add_event_type(name: str, description: str | None, schema_text: str | None, now_ms: int) -> str:
    """Register a type, or replace an existing one's description and schema; says what changed."""
    if not NAME_PATTERN.fullmatch(name) or len(name) > MAX_NAME_LENGTH:
        raise OperatorError(f"{name!r} is not an event type name: lowercase dotted words, e.g. lead.created "
                            f"(at most {MAX_NAME_LENGTH} characters).")
    if name.startswith(RESERVED_PREFIX):
        raise OperatorError(f"{RESERVED_PREFIX}* event types are the service's own.")
    if description is not None and (len(description) > MAX_DESCRIPTION_LENGTH or safe_text.unfit_for_a_label(description)):
        raise OperatorError(f"A description is plain text (no control or bidi formatting character), at most "
                            f"{MAX_DESCRIPTION_LENGTH} characters: partners read it in the API document.")
    schema = _checked_schema(schema_text) if schema_text is not None else None
    with write_transaction():
        old = EventType.get_or_none(EventType.name == name)
        if old is None:
            EventType.create(name=name, description=description, schema=schema, created_at=now_ms, updated_at=now_ms)
            return f"{name}: added"
        changes = [what for what, before, after in (("description", old.description, description),
                                                    ("schema", old.schema, schema)) if before != after]
        if old.retired_at is not None:
            changes.append("no longer retired")
        EventType.update(description=description, schema=schema, updated_at=now_ms, retired_at=None).where(
            EventType.name == name).execute()
    return f"{name}: " + (", ".join(f"{change} changed" if change != "no longer retired" else change
                                    for change in changes) or "unchanged")


def _checked_schema(text: str) -> str:
    if len(text.encode()) > MAX_SCHEMA_BYTES:
        raise OperatorError(f"The schema is over {MAX_SCHEMA_BYTES // 1024} KiB.")
    try:
        schema = json.loads(text)
        BoundedValidator.check_schema(schema)
    except (ValueError, SchemaError) as error:
        raise OperatorError(f"Not a valid JSON Schema (draft 2020-12): {str(error).splitlines()[0][:200]}") from None
    return json.dumps(schema, separators=(",", ":"), ensure_ascii=False)


def retire_event_type(name: str, now_ms: int) -> None:
    if not NAME_PATTERN.fullmatch(name):  # never registered, and PostgreSQL refuses NUL in a query
        raise OperatorError(f"No event type {name!r}.")
    with write_transaction():
        if not EventType.update(retired_at=now_ms).where((EventType.name == name) & EventType.retired_at.is_null()).execute():
            if not EventType.select().where(EventType.name == name).exists():
                raise OperatorError(f"No event type {name!r}.")


def list_event_types() -> list[tuple]:
    """(name, description, has a schema, retired_at, subscriptions filtering on it), by name."""
    filters = [row["events"] for row in select_rows(
        "SELECT events FROM subscription WHERE events IS NOT NULL AND deleted_at IS NULL", {})]
    return [(t.name, t.description, t.schema is not None, t.retired_at,
             sum(1 for f in filters if matches(f, t.name)))
            for t in EventType.select().order_by(EventType.name)]

