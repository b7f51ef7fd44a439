"""DNS lookups with a time limit: a name whose DNS does not answer holds its caller only so long.

The system resolver (getaddrinfo: /etc/hosts, then DNS, in the host's name-service order) cannot
be interrupted, so each lookup runs on a small pool of daemon threads of its own and the caller
waits for the answer at most the time it can afford. A lookup already under way for the same name
is shared rather than started again, so a name that never answers ties up one thread, not one per
attempt or request.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future

Resolver = Callable[[str], Sequence[str]]


class Lookups:
    """Runs `resolve` on at most `threads` daemon threads, started when first needed."""

    def __init__(self, resolve: Resolver, threads: int = 16) -> None:
        self._resolve = resolve
        self._max_threads = threads
        self._threads = 0
        self._idle_threads = 0
        self._jobs: queue.SimpleQueue[tuple[str, Future]] = queue.SimpleQueue()
        self._pending: dict[str, Future] = {}
        self._lock = threading.Lock()

    def within(self, seconds: float) -> Resolver:
        """A resolver that raises TimeoutError when no answer comes within `seconds`."""
        return lambda host: self.resolve(host, seconds)

    def resolve(self, host: str, seconds: float) -> Sequence[str]:
        """The resolver's answer for `host`, or its exception; TimeoutError after `seconds`."""
        future = self._lookup(host)
        try:
            return future.result(timeout=max(0.0, seconds))
        except TimeoutError:  # concurrent.futures.TimeoutError is TimeoutError since Python 3.11
            if not future.done():
                raise TimeoutError(f"no answer for {host!r} within {seconds:g} s") from None
            return future.result()

    def _lookup(self, host: str) -> Future:
        with self._lock:
            future = self._pending.get(host)
            if future is not None:
                return future
            future = self._pending[host] = Future()
            self._jobs.put((host, future))
            if self._idle_threads <= 0 and self._threads < self._max_threads:
                self._threads += 1
                threading.Thread(target=self._work, name=f"dns-{self._threads}", daemon=True).start()
            else:
                self._idle_threads -= 1  # taken by the job just queued (or queued behind the others)
        return future

    def _work(self) -> None:
        while True:
            host, future = self._jobs.get()
            try:
                answer, failure = self._resolve(host), None
            except BaseException as error:  # the caller decides what a failed lookup means
                answer, failure = None, error
            with self._lock:  # forgotten before anyone hears the answer: a later lookup asks anew
                del self._pending[host]
                self._idle_threads += 1
            if failure is None:
                future.set_result(answer)
            else:
                future.set_exception(failure)
