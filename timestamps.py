"""Time at the edges: the database keeps Unix milliseconds, the API speaks RFC 3339."""

from datetime import datetime, timezone

from flask import current_app


def iso(ms: int | None) -> str | None:
    """RFC 3339 UTC with milliseconds and Z, e.g. 2026-11-22T10:15:30.123Z."""
    if ms is None:
        return None
    moment = datetime.fromtimestamp(ms // 1000, tz=timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def to_ms(seconds: float) -> int:
    return int(seconds * 1000)


def now_ms() -> int:
    """The service's current time (the CLOCK setting, injectable in tests) in Unix milliseconds."""
    return to_ms(current_app.config["CLOCK"]())
