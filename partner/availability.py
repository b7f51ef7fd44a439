"""Logging a dependency's outage as an operator wants to read it: one ERROR when it starts failing
(or fails in a new way), one line when it works again, and nothing per request or per poll between."""

import logging
import threading
import time


def describe(error: BaseException) -> str:
    """The failure's type and the first line of its message: equal for repeats of one failure."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


class Outage:
    """The state of one dependency (the database, the rate-limit storage) as seen by this process."""

    def __init__(self, log: logging.Logger, what: str, consequence: str, each_failure: bool = True):
        """`each_failure`: log a failure of a new kind during an outage too, not only its start."""
        self._log, self._what, self._consequence = log, what, consequence
        self._each_failure = each_failure
        self._lock = threading.Lock()
        self._failure: str | None = None
        self._started_at = 0.0
        self._count = 0

    @property
    def active(self) -> bool:
        return self._failure is not None

    def failed(self, error: BaseException) -> None:
        """Count one failure; log it only if the dependency was working or failed differently."""
        failure = describe(error)
        with self._lock:
            self._count += 1
            if failure == self._failure or (self._failure and not self._each_failure):
                return
            if self._failure is None:
                self._started_at = time.monotonic()
            self._failure = failure
        self._log.error("%s unavailable (%s): %s until it answers again", self._what, failure,
                        self._consequence)

    def recovered(self) -> None:
        """The dependency answered: log the end of the outage, if there was one."""
        if self._failure is None:  # the common case, without taking the lock
            return
        with self._lock:
            if self._failure is None:
                return
            seconds, count = time.monotonic() - self._started_at, self._count
            self._failure, self._count = None, 0
        self._log.warning("%s answers again after %.1f s (%d failures meanwhile)", self._what, seconds,
                          count)
