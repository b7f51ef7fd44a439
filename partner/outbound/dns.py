"""DNS lookups that belong to their tenant: one organization's names that never answer cannot make
another organization's lookups wait or fail.

The system resolver (getaddrinfo: /etc/hosts, then DNS, in the host's name-service order) cannot be
interrupted, so a lookup runs on a daemon thread of this pool, never on its caller's thread (a
request thread, a delivery slot), and the caller waits for the answer until its own deadline (a
create's lookup budget, an attempt's remaining time) and no longer: TimeoutError. Its thread stays
in getaddrinfo until the resolver gives up (glibc: 5 s per server and try, often longer), whatever
the caller does. That thread is what a tenant can take from the others: in release 1.2 every lookup
queued in one FIFO behind a fixed number of threads, and a handful of names that never answer, all
of one organization, held every thread; every other organization's lookups then waited in the queue
until their callers gave up, their creates refused as `invalid_url`, their attempts recorded as
timeouts. Three rules now, in the order a lookup meets them:

1. Per tenant: lookups of at most `per_tenant` names in flight, and, if `waiting_per_tenant` is
   set, at most that many of its callers waiting. A tenant holds a name from the moment one of its
   callers asks until each of them has stopped waiting and, if one of them started the lookup, the
   resolver has answered, whichever comes later: a lookup abandoned at its caller's deadline still
   counts while its thread is stuck. So a tenant whose names never answer holds at most
   `per_tenant` threads, however often it asks; it is refused beyond that, as is any tenant at its
   bound, whoever's names are slow. Its callers asking again for a name it holds cost no more: a
   partner with a few endpoints whose names never answer still has lookups for the others.
   Creates bound their waiting callers too, since those are request threads, per tenant and for the
   whole process, below the request threads it has: two tenants' creates on names that never answer
   leave the others a thread (a delivery slot is bounded by the dispatcher).
2. Per name: one lookup at a time, shared by every caller that asks for the name while it runs (of
   any tenant, each counted against its own): a name that never answers holds one thread, not one
   per caller; a tenant asking for a name another's lookup holds waits for that same answer, which
   is its own name's answer too.
3. No queue: a lookup starts at once on an idle thread (or a new one, up to `threads`) or does not
   start: LookupsBusy, at once. A queue helps only if threads come free before the callers waiting
   in it give up, and threads held by names that never answer come free after the resolver's 10 s
   or more, later than any caller's deadline: queued, a lookup turns into a timeout that judges the
   caller's URL for what others' names did. With `per_tenant` well under `threads`, every thread is
   taken only when `threads / per_tenant` tenants each fill their share at once.

LookupsBusy is not a verdict on the name, so its callers never treat it as one: a create answers 503
`service_unavailable` with Retry-After (edge/problems.py), nothing changed; a delivery attempt is
given back uncounted, due again a few seconds later (partner/courier.py): no lookup, so no attempt,
was made. It is one of errors.OurResourcesBusy, as a socket the descriptor budget refuses is
(sockets.py). The bounds hold per process, as the pools do.
"""

from __future__ import annotations

import queue
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import Future

from partner.errors import OurResourcesBusy

Resolver = Callable[[str], Sequence[str]]


class LookupsBusy(OurResourcesBusy):
    """No lookup could start for this caller now: its tenant has `per_tenant` lookups in flight, or
    every thread holds another lookup. Says nothing about the name."""

    what = "DNS lookup not started"
    # Lookups that fill a bound are slow ones, and one stuck on a name that never answers ends with the
    # resolver's first timeout (5 s) at the soonest: asked sooner, the bound is still full, and every
    # refusal costs a claim and a write (an organization with 100 dead names pinged: 160 a second at 1 s).
    retry_seconds = 5


class _Lookup:
    """One lookup under way: its answer, the tenant whose caller started it, and whether that caller
    still waits (once it has stopped, the lookup's end gives the tenant's count back)."""

    def __init__(self, tenant: str) -> None:
        self.future: Future = Future()
        self.tenant = tenant
        self.starter_waiting = True


class Lookups:
    """Runs `resolve` on at most `threads` daemon threads, started when first needed, with lookups of
    at most `per_tenant` names in flight for each tenant, at most `waiting_per_tenant` of its callers
    waiting, and at most `waiting` callers of every tenant together (None: no such bound; module
    docstring)."""

    def __init__(self, resolve: Resolver, threads: int = 16, per_tenant: int = 4,
                 waiting_per_tenant: int | None = None, waiting: int | None = None) -> None:
        self._resolve = resolve
        self._max_threads = threads
        self._per_tenant, self._waiting_per_tenant, self._most_waiting = per_tenant, waiting_per_tenant, waiting
        self._threads = 0
        self._idle_threads = 0
        self._jobs: queue.SimpleQueue[tuple[str, _Lookup]] = queue.SimpleQueue()
        self._pending: dict[str, _Lookup] = {}
        self._held: dict[str, Counter[str]] = {}  # tenant -> the names it holds, each with its holds
        self._waiting: Counter[str] = Counter()  # tenant -> its callers waiting
        self._lock = threading.Lock()

    def resolver_for(self, tenant: str, remaining: Callable[[], float]) -> Resolver:
        """A resolver for one caller of `tenant` whose waiting ends at that caller's deadline:
        `remaining()` is how many seconds it still has (it may raise TimeoutError once none)."""
        return lambda host: self.resolve(host, tenant, remaining())

    def resolve(self, host: str, tenant: str, seconds: float) -> Sequence[str]:
        """The resolver's answer for `host`, or its exception; TimeoutError after `seconds`;
        LookupsBusy at once when no lookup can start for `tenant`."""
        lookup, started = self._join_or_start(host, tenant)
        try:
            return lookup.future.result(timeout=max(0.0, seconds))
        except TimeoutError:  # concurrent.futures.TimeoutError is TimeoutError since Python 3.11
            if not lookup.future.done():
                raise TimeoutError(f"no answer for {host!r} within {seconds:g} s") from None
            return lookup.future.result()
        finally:
            self._stop_waiting(lookup, host, tenant, started)

    def _join_or_start(self, host: str, tenant: str) -> tuple[_Lookup, bool]:
        """The lookup under way for `host`, or a new one on a thread; whether this caller started it."""
        with self._lock:
            held = self._held.get(tenant, {})
            if host not in held and len(held) >= self._per_tenant:
                raise LookupsBusy(f"lookups of {self._per_tenant} names of this tenant are under way")
            if self._waiting_per_tenant is not None and self._waiting[tenant] >= self._waiting_per_tenant:
                raise LookupsBusy(f"{self._waiting_per_tenant} callers of this tenant wait for lookups")
            if self._most_waiting is not None and self._waiting.total() >= self._most_waiting:
                raise LookupsBusy(f"{self._most_waiting} callers of every tenant wait for lookups")
            lookup = self._pending.get(host)
            started = lookup is None
            if started:
                if self._idle_threads <= 0 and self._threads >= self._max_threads:
                    raise LookupsBusy(f"all {self._max_threads} lookup threads are busy")
                lookup = self._pending[host] = _Lookup(tenant)
                if self._idle_threads > 0:
                    self._idle_threads -= 1  # the job just queued is that thread's
                else:
                    self._threads += 1
                    threading.Thread(target=self._work, name=f"dns-{self._threads}", daemon=True).start()
                self._jobs.put((host, lookup))
            self._held.setdefault(tenant, Counter())[host] += 1
            self._waiting[tenant] += 1
        return lookup, started

    def _stop_waiting(self, lookup: _Lookup, host: str, tenant: str, started: bool) -> None:
        with self._lock:
            self._waiting[tenant] -= 1
            if not self._waiting[tenant]:
                del self._waiting[tenant]  # a Counter keeps zeros: one entry per tenant ever seen
            if started and not lookup.future.done():
                lookup.starter_waiting = False  # the lookup's end gives its hold back (_work)
            else:
                self._give_back(tenant, host)

    def _give_back(self, tenant: str, host: str) -> None:
        held = self._held[tenant]
        held[host] -= 1
        if not held[host]:
            del held[host]
            if not held:
                del self._held[tenant]

    def _work(self) -> None:
        while True:
            host, lookup = self._jobs.get()
            try:
                answer, failure = self._resolve(host), None
            except BaseException as error:  # the caller decides what a failed lookup means
                answer, failure = None, error
            with self._lock:  # forgotten before anyone hears the answer: a later lookup asks anew
                del self._pending[host]
                self._idle_threads += 1
                if not lookup.starter_waiting:
                    self._give_back(lookup.tenant, host)
                # Under the lock: a starter that stops waiting now sees the answer and gives its
                # count back itself, and no thread gives it back twice.
                if failure is None:
                    lookup.future.set_result(answer)
                else:
                    lookup.future.set_exception(failure)
