"""Time at the edges: the database keeps Unix milliseconds, the API speaks RFC 3339."""

from datetime import datetime, timezone


def iso(ms: int | None) -> str | None:
    """RFC 3339 UTC with milliseconds and Z, e.g. 2026-11-22T10:15:30.123Z."""
    if ms is None:
        return None
    moment = datetime.fromtimestamp(ms // 1000, tz=timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def to_ms(seconds: float) -> int:
    return int(seconds * 1000)


def now_ms(clock) -> int:
    """`clock` (Unix seconds: the CLOCK setting, injectable in tests) read in Unix milliseconds."""
    return to_ms(clock())
