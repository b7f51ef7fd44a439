"""SPEC's envelope, the body of every delivery: `{"event", "id", "subscription_id", "occurred_at", "data"}`
as compact JSON. An event's `data` is stored once, however many subscriptions it goes to; each
delivery's body is built around those bytes by this one function, so every attempt of a delivery
sends the same bytes (CONTRACT §11: "serialized once")."""

import json

from partner.timestamps import iso


def compact(value) -> bytes:
    """JSON as the service stores and sends it: no spaces, UTF-8, keys in the order given."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def envelope(kind: str, event_id: str, subscription_id: str, occurred_at: int, data: bytes) -> bytes:
    """The delivery's body: the envelope with `data` (compact JSON bytes) spliced in as they are."""
    head = compact({"event": kind, "id": event_id, "subscription_id": subscription_id, "occurred_at": iso(occurred_at)})
    return head[:-1] + b',"data":' + data + b"}"
