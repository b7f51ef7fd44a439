"""The process's partner sockets, a resource shared by every tenant. urllib3 bounds one pool's idle
connections (`maxsize`) and the pools (`num_pools`), never their product, and keeps each idle one
until it is reused or its pool is evicted, however old (STYLE's urllib3 trap): 64 pools of 64 could
hold 4,096 descriptors, partners' hang-ups among them, and one organization churning targets once
took a worker to its limit of 1,024 (issue 41). `Sockets` bounds them, told by each pool's queue of
idle connections (IdleQueue, urllib3's own LifoQueue) and by each connection as it dials and closes
(connections.py):
- every socket dialled counts against a descriptor budget: RLIMIT_NOFILE's soft limit, read once,
  less RESERVE for everything else. Before a dial past it the least recently used idle connection
  is closed; if none is idle, the dial is refused: SocketsBusy, one of OurResourcesBusy, so the
  attempt is put off, never the partner's failure (partner/courier.py);
- at most MOST_IDLE connections idle, the least recently used closed first, and none idle longer
  than IDLE_SECONDS: checked as each connection comes back, and at each scan of the dispatcher.
"""

from __future__ import annotations

import queue
import resource
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from urllib3.connection import HTTPConnection

from partner.errors import OurResourcesBusy

MOST_IDLE = 256  # idle connections kept per process, whichever partners they go to
# An idle connection older than this is closed: most servers close theirs sooner (Node.js after 5 s,
# nginx 75 s), and one they closed holds our descriptor until we do.
IDLE_SECONDS = 30
RESERVE = 512  # descriptors of RLIMIT_NOFILE left for all but partner sockets: database, clients, logs


class SocketsBusy(OurResourcesBusy):
    """No socket may be dialled now: the descriptor budget is spent on sockets in use, or the
    process (or the system) has no descriptor left."""

    what = "no socket opened"


def descriptor_budget(reserve: int = RESERVE) -> int:
    """How many partner sockets this process may have open: RLIMIT_NOFILE's soft limit less
    `reserve`, or half of a limit that small."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return sys.maxsize if soft == resource.RLIM_INFINITY else max(soft - reserve, soft // 2)


class Sockets:
    """The process's partner sockets: how many are open, and the connections idle in its pools,
    least recently used first (module docstring). `clock` is a seam for tests."""

    def __init__(self, most_open: int | None = None, most_idle: int = MOST_IDLE,
                 idle_seconds: float = IDLE_SECONDS, clock: Callable[[], float] = time.monotonic) -> None:
        self.most_open = descriptor_budget() if most_open is None else most_open
        self.most_idle, self.idle_seconds, self._clock = most_idle, idle_seconds, clock
        self.open = 0
        self._idle: OrderedDict[HTTPConnection, tuple[IdleQueue, float]] = OrderedDict()  # -> (its queue, since)
        self._lock = threading.Lock()

    @property
    def idle(self) -> int:
        return len(self._idle)

    def opening(self) -> None:
        """Count a socket about to be dialled, closing idle connections to make room for it;
        SocketsBusy if every socket the budget allows is in use."""
        self.close_idle(room=1)
        with self._lock:
            if self.open >= self.most_open:
                raise SocketsBusy(f"{self.open} partner sockets open, the most this process may have")
            self.open += 1

    def closed(self) -> None:
        with self._lock:
            self.open -= 1

    def close_idle(self, room: int = 0) -> None:
        """Close the connections idle for idle_seconds or beyond most_idle, least recently used first,
        and as many more as leave `room` under the descriptor budget."""
        now, chosen = self._clock(), []
        with self._lock:
            for conn, (pool_queue, since) in self._idle.items():
                if (len(self._idle) - len(chosen) <= self.most_idle and now - since < self.idle_seconds
                        and self.open - len(chosen) + room <= self.most_open):
                    break
                chosen.append((conn, pool_queue))
            for conn, _ in chosen:
                del self._idle[conn]
        for conn, pool_queue in chosen:
            for taken in pool_queue.take_back([conn]):  # none if an attempt took it meanwhile
                taken.close()

    # Called by an IdleQueue, under its lock: a connection is idle there from `put` until `taken`.
    def put(self, conn: HTTPConnection, pool_queue: IdleQueue) -> None:
        with self._lock:
            self._idle[conn] = (pool_queue, self._clock())
            self._idle.move_to_end(conn)

    def taken(self, conn: HTTPConnection) -> None:
        with self._lock:
            self._idle.pop(conn, None)


class IdleQueue(queue.LifoQueue):
    """A pool's idle connections, as urllib3 keeps them (None: room to dial one), each told to
    `sockets` as it comes and goes."""

    def __init__(self, sockets: Sockets, maxsize: int) -> None:
        super().__init__(maxsize)
        self.sockets = sockets

    def _put(self, conn: HTTPConnection | None) -> None:
        super()._put(conn)
        if conn is not None and conn.sock is not None:  # one whose response was cut short comes back closed
            self.sockets.put(conn, self)

    def _get(self) -> HTTPConnection | None:
        conn = super()._get()
        if conn is not None:
            self.sockets.taken(conn)
        return conn

    def take_back(self, wanted: list | None = None) -> list[HTTPConnection]:
        """Take out those of `wanted` (None: all) still idle here, leaving their room (None); the
        caller closes them. Under the queue's lock, so no attempt takes one as it goes."""
        with self.mutex:
            taken = [conn for conn in self.queue if conn is not None and (wanted is None or conn in wanted)]
            self.queue[:] = [None if conn in taken else conn for conn in self.queue]
            for conn in taken:
                self.sockets.taken(conn)
        return taken
