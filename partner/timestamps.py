"""Time at the edges: the database keeps Unix milliseconds, the API speaks RFC 3339."""

import functools
import re
from datetime import datetime, timezone

_RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})")


def iso(ms: int | None) -> str | None:
    """RFC 3339 UTC with milliseconds and Z, e.g. 2026-11-22T10:15:30.123Z."""
    if ms is None:
        return None
    return f"{_iso_second(ms // 1000)}{ms % 1000:03d}Z"


# A page of 100 failures formats 200 timestamps, and the same ones again on the next read:
# strftime costs ~2 µs, a cache hit a tenth of that.
@functools.lru_cache(maxsize=4096)
def _iso_second(seconds: int) -> str:
    return datetime.fromtimestamp(seconds, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.")


def parse_rfc3339(text: str) -> int | None:
    """An RFC 3339 time with its offset (`2026-11-22T10:15:30.123Z`) as Unix milliseconds; None if it is not one."""
    if not _RFC3339.fullmatch(text):
        return None
    try:
        return to_ms(datetime.fromisoformat(text.upper()).timestamp())
    except (ValueError, OverflowError):  # a 31st of February, an hour 25
        return None


def to_ms(seconds: float) -> int:
    return int(seconds * 1000)


def now_ms(clock) -> int:
    """`clock` (Unix seconds: the CLOCK setting, injectable in tests) read in Unix milliseconds."""
    return to_ms(clock())
