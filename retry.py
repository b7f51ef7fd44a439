"""The retry schedule and the auto-disable rule, as pure functions of values."""

import math
from collections.abc import Sequence

# Delays may grow by up to 10 % so that retries of many events do not arrive in lockstep;
# they never shrink below the table.
MAX_JITTER = 0.10


def max_attempts(delays: Sequence[float]) -> int:
    """Attempts per event: one, plus one after each delay."""
    return len(delays) + 1


def next_attempt_at(attempt: int, finished_at_ms: int, delays: Sequence[float],
                    jitter: float = 0.0) -> int | None:
    """When to make the attempt after failed attempt number `attempt` (1-based), counted from
    the end of that attempt; None when it was the last one and the delivery is dead-lettered."""
    if attempt >= max_attempts(delays):
        return None
    # Whole milliseconds: float products like 1_800_000 * 1.1 round past the 10 % cap.
    delay_ms = math.ceil(delays[attempt - 1] * 1000)
    extra_ms = min(int(delay_ms * max(jitter, 0.0)), delay_ms // 10)
    return finished_at_ms + delay_ms + extra_ms


def reaches_auto_disable(consecutive_failures: int, threshold: int) -> bool:
    """True once a subscription has failed `threshold` attempts in a row."""
    return consecutive_failures >= threshold
