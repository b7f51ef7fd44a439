"""Every registered, unretired event type in the partner's document (CONTRACT §11): /openapi.json's
`webhooks` gains one entry per type, built from the `vc.test.ping` entry of openapi.yaml (its
headers, its answers), with the type's description and its `data` schema inside SPEC's envelope.

Each process reads the registry again when its copy is over REFRESH_SECONDS old, so a type added,
changed or retired by the CLI shows in every process's document within that; a read that fails
(the database is unavailable) keeps the document last built."""

import copy
import json
import logging
import threading

from partner import event_types
from partner.store.availability import is_unavailable
from partner.store.connection import db

REFRESH_SECONDS = 4.0  # under the 5 s CONTRACT §11 allows
TEMPLATE = "vc.test.ping"

log = logging.getLogger(__name__)


def with_event_types(document: dict, types: list) -> dict:
    """`document` with a `webhooks` entry for each unretired type (event_types.KnownType)."""
    described = copy.deepcopy(document)
    template = document["webhooks"][TEMPLATE]["post"]
    schemas = described["components"]["schemas"]
    for known in types:
        if known.retired_at is not None:
            continue
        data_name = f"{known.name}.data"
        schemas[data_name] = _local(json.loads(known.schema), data_name) if known.schema else {"type": "object"}
        schemas[f"{known.name}.event"] = _envelope(known.name, data_name)
        described["webhooks"][known.name] = {"post": _operation(template, known, f"{known.name}.event")}
    return described


def _operation(template: dict, known, envelope_name: str) -> dict:
    operation = copy.deepcopy(template)
    operation.update(operationId=f"event_{known.name.replace('.', '_')}", summary=f"{known.name}: what your receiver gets",
                     description=(known.description or f"The platform's `{known.name}` event.") +
                     f"\n\nDelivered, signed and retried exactly as `{TEMPLATE}` (see it for how to verify).")
    for parameter in operation["parameters"]:
        if parameter["name"] == "X-VC-Event":
            parameter["schema"] = {"type": "string", "const": known.name}
    operation["requestBody"] = {"required": True, "description": "The event envelope, compact JSON.",
                                "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{envelope_name}"}}}}
    return operation


def _envelope(kind: str, data_name: str) -> dict:
    return {"type": "object", "additionalProperties": False,
            "required": ["event", "id", "subscription_id", "occurred_at", "data"],
            "properties": {"event": {"type": "string", "const": kind},
                           "id": {"$ref": "#/components/schemas/EventId"},
                           "subscription_id": {"$ref": "#/components/schemas/SubscriptionId"},
                           "occurred_at": {"$ref": "#/components/schemas/Timestamp"},
                           "data": {"$ref": f"#/components/schemas/{data_name}"}}}


def _local(schema, name: str):
    """The schema with its own `#…` references made to point inside it where it now sits."""
    if isinstance(schema, dict):
        return {key: (f"#/components/schemas/{name}{value[1:]}" if key == "$ref" and isinstance(value, str)
                      and value.startswith("#") else _local(value, name)) for key, value in schema.items()
                if key not in ("$schema", "$id")}
    if isinstance(schema, list):
        return [_local(item, name) for item in schema]
    return schema


class LiveDocument:
    """The partner's document as JSON text, with the registry's types, rebuilt every REFRESH_SECONDS of
    `clock` (Unix seconds: the CLOCK setting)."""

    def __init__(self, document: dict, clock):
        self._static, self._clock = document, clock
        self._text, self._built_at = json.dumps(document, ensure_ascii=False), None
        self._lock = threading.Lock()

    def text(self) -> str:
        if self._built_at is None or self._clock() - self._built_at >= REFRESH_SECONDS:
            if self._lock.acquire(blocking=False):  # one refresh at a time; the others serve the last
                try:
                    self._refresh()
                finally:
                    self._lock.release()
        return self._text

    def _refresh(self) -> None:
        try:
            with db.connection_context():
                types = list(event_types.registry().values())
        except Exception as error:  # noqa: BLE001 - unavailability keeps the last document
            if not is_unavailable(error):
                raise
            log.warning("the API document keeps its last event types: the database is unavailable")
            self._built_at = self._clock()
            return
        self._text = json.dumps(with_event_types(self._static, types), ensure_ascii=False)
        self._built_at = self._clock()
