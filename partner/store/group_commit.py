"""Group commit: the outcomes of attempts finishing together are written at once.

An outcome must be committed before its attempt's slot is freed (the writer frees the batch's as it
commits: delivery.py says why), and so before its delivery can be claimed again. Written one
transaction each, the delivery threads of a process queue for SQLite's one writer, and a second process sleeps in SQLite's busy handler between them: the writes, not the
work, set the pace (bench/scale_out). Here the first thread to find the writer free writes every
outcome queued until then, in one write (outcomes.write_outcomes), while the others wait for it;
whatever arrives meanwhile is written by the next one. No thread of its own and no timer: a lone
outcome is written at once, a crowd in a few writes.

A batch that fails is written again one outcome at a time, so that one outcome the database
refuses costs the others nothing (unless the database itself is unavailable: then every caller
gets that error at once); each caller sees its own outcome's result or error.
"""

import logging
import threading
from collections.abc import Callable
from typing import Any

from partner.store.connection import db
from partner.store.availability import is_unavailable

log = logging.getLogger(__name__)


class _Queued:
    def __init__(self, item: Any):
        self.item = item
        self.done = False
        self.result: Any = None
        self.error: BaseException | None = None
        # Released when the item is written, or when its caller is to write the next batch: each
        # caller is woken alone, not every waiting thread at each commit (with hundreds of delivery
        # threads waiting, waking them all to look cost a fifth of a delivery's CPU).
        self.turn = threading.Lock()
        self.turn.acquire()


class GroupCommit:
    """Writes items in batches: `write(items)` writes them in one transaction and returns their
    results; `committed(item)` is called for each, by the thread that wrote them, once they are
    committed and before any of their callers runs again."""

    def __init__(self, write: Callable[[list], list], committed: Callable[[Any], Any] = lambda item: None):
        self._write_items = write
        self._committed = committed
        self._lock = threading.Lock()  # guards the queue and the writer's role
        self._queue: list[_Queued] = []
        self._writing = False  # a caller is writing a batch, or has been woken to write the next

    def run(self, item: Any) -> Any:
        """Write `item` in one transaction with whatever else is queued; return its result once
        committed, or raise its error or the commit's."""
        queued = _Queued(item)
        with self._lock:
            self._queue.append(queued)
            waits, self._writing = self._writing, True
        if waits:
            queued.turn.acquire()  # written by another, or its turn to write what is queued
        if not queued.done:
            with self._lock:
                batch, self._queue = self._queue, []
            try:
                self._write(batch)
            finally:
                self._hand_over(batch)
        if queued.error is not None:
            raise queued.error
        return queued.result

    def _hand_over(self, batch: list[_Queued]) -> None:
        """Wake the batch's callers with their answers, and the first caller queued since, to write next."""
        for unwritten in batch:  # interrupted (a BaseException): none may wait for good
            if not unwritten.done:
                unwritten.error, unwritten.done = RuntimeError("the batch was not written"), True
        with self._lock:
            following = self._queue[0] if self._queue else None
            self._writing = following is not None
        for queued in batch:
            queued.turn.release()
        if following is not None:
            following.turn.release()

    def _write(self, batch: list[_Queued]) -> None:
        try:
            with db.connection_context():
                results = self._write_items([queued.item for queued in batch])
        except Exception as error:  # noqa: BLE001 - handed to the callers, who decide
            if len(batch) > 1 and not is_unavailable(error):
                for queued in batch:
                    self._write([queued])
                return
            for queued in batch:
                queued.error = error
        else:
            for queued, result in zip(batch, results):
                queued.result = result
        for queued in batch:  # read by each caller once its turn is released
            queued.done = True
        for queued in batch:
            if queued.error is None:
                self._tell_committed(queued.item)

    def _tell_committed(self, item: Any) -> None:
        try:
            self._committed(item)
        except Exception:  # noqa: BLE001 - the item is committed whatever its hook does: its caller must hear so
            log.exception("group commit: the hook after a commit failed")
