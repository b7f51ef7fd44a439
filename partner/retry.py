"""The retry schedule and the failure decision, as pure functions of values."""

import math
from collections.abc import Sequence
from dataclasses import dataclass

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


@dataclass(frozen=True)
class Decision:
    """What follows a failed attempt: the next attempt (None: dead-letter) and whether the
    subscription is auto-disabled now."""
    next_attempt_at: int | None
    auto_disable: bool


@dataclass(frozen=True)
class RetryPolicy:
    """The schedule (seconds between attempts) and the auto-disable threshold."""
    delays: Sequence[float]
    auto_disable_threshold: int

    def after_failure(self, attempt: int, consecutive_failures: int, active: bool,
                      finished_at_ms: int, jitter: float) -> Decision:
        """The one failure decision. `consecutive_failures` already counts this attempt; `active`
        is the subscription's state before it. A disabled subscription is never retried."""
        auto_disable = active and consecutive_failures >= self.auto_disable_threshold
        if auto_disable or not active:
            return Decision(None, auto_disable)
        return Decision(next_attempt_at(attempt, finished_at_ms, self.delays, jitter), False)
