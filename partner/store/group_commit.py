"""Group commit: the outcomes of attempts finishing together are written at once.

An outcome must be committed before its attempt's slot is freed, and so before its delivery can be
claimed again. Written one transaction each, the delivery threads of a process queue for SQLite's
one writer, and a second process sleeps in SQLite's busy handler between them: the writes, not the
work, set the pace (bench/scale_out). Here the first thread to find the writer free writes every
outcome queued until then, in one write (outcomes.write_outcomes), while the others wait for it;
whatever arrives meanwhile is written by the next one. No thread of its own and no timer: a lone
outcome is written at once, a crowd in a few writes.

A batch that fails is written again one outcome at a time, so that one outcome the database
refuses costs the others nothing (unless the database itself is unavailable: then every caller
gets that error at once); each caller sees its own outcome's result or error.
"""

import threading
from collections.abc import Callable
from typing import Any

from partner.store.connection import db
from partner.store.availability import is_unavailable


class _Queued:
    def __init__(self, item: Any):
        self.item = item
        self.done = False
        self.result: Any = None
        self.error: BaseException | None = None


class GroupCommit:
    """Writes items in batches: `write(items)` writes them in one transaction and returns their
    results."""

    def __init__(self, write: Callable[[list], list]):
        self._write_items = write
        self._queue: list[_Queued] = []
        self._changed = threading.Condition()
        self._writing = False  # a thread is writing a batch

    def run(self, item: Any) -> Any:
        """Write `item` in one transaction with whatever else is queued; return its result once
        committed, or raise its error or the commit's."""
        queued = _Queued(item)
        with self._changed:
            self._queue.append(queued)
            self._changed.wait_for(lambda: queued.done or not self._writing)
            if not queued.done:  # the writer is free: write everything queued, this one with it
                self._writing = True
                batch, self._queue = self._queue, []
        if not queued.done:
            try:
                self._write(batch)
            finally:
                with self._changed:
                    for unwritten in batch:  # interrupted (a BaseException): none may wait for good
                        if not unwritten.done:
                            unwritten.error, unwritten.done = RuntimeError("the batch was not written"), True
                    self._writing = False
                    self._changed.notify_all()
        if queued.error is not None:
            raise queued.error
        return queued.result

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
        for queued in batch:  # read by the callers once the writer lets go of _changed
            queued.done = True
