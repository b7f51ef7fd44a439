"""Attempts in flight per subscription (partner/concurrency.py): the rule as pure functions, then the
queue stepped by hand on the real database (the limit widens, narrows, holds for a Retry-After and
across claimers), then real dispatchers and receivers."""

import logging
import multiprocessing
import sys
import sqlite3
import threading
import time
from collections import Counter
from email.utils import format_datetime
from datetime import datetime, timezone

import pytest

from models import Delivery, Failure, Subscription, db
from partner.claims import any_due, next_due_at
from partner.keys import create_key
from partner.concurrency import (FIRST_BACKOFF_MS, MAX_BACKOFF_MS, Limit, backoff_until, hold_until, narrowed, narrows,
                                 widened)
from partner.outbox import claim_due
from partner.outcomes import Outcome, write_outcomes
from partner.outbound.transport import AttemptResult
from partner.subscriptions import set_concurrency
from tests.receivers import too_many_after_retry_after
from tests.support import allow_in_sqlite, delivery_of, eventually, refuse_in_sqlite, run_together
from tests.test_fair_claims import LEASE, NOW, POLICY, enqueue_ping, subscriptions
from tests.test_metrics import scrape, value

CLOCK_START = NOW / 1000
OK = AttemptResult(True, 200, None, "", 1)
TIMED_OUT = AttemptResult(False, None, "timeout", "", 10_000)


def refused(status: int, retry_after: str | None = None) -> AttemptResult:
    return AttemptResult(False, status, "http_status", "", 1, retry_after=retry_after)


# --- the rule ---------------------------------------------------------------------------------

@pytest.mark.parametrize("before, successes, after", [
    (Limit(1), 1, Limit(2)), (Limit(4), 4, Limit(8)), (Limit(12), 8, Limit(16)), (Limit(16), 3, Limit(16))])
def test_until_its_receiver_pushes_back_each_success_widens_by_one(before, successes, after):
    assert widened(before, [0.99] * successes, 16) == after


@pytest.mark.parametrize("before, after", [
    (Limit(16), Limit(12, 16)), (Limit(8, 3), Limit(6, 8)), (Limit(5), Limit(4, 5)), (Limit(4), Limit(3, 4)),
    (Limit(2), Limit(1, 2)), (Limit(1, 2), Limit(1, 1))])
def test_a_push_back_narrows_to_three_quarters_at_least_one_less_and_remembers_where(before, after):
    assert narrowed(before) == after


def test_sixteen_timeouts_in_a_row_narrow_sixteen_to_one():
    limit = Limit(16)
    for _ in range(16):
        limit = narrowed(limit)
    assert limit.limit == 1


@pytest.mark.parametrize("draw, after", [(0.3333, Limit(4, 8)), (0.3334, Limit(3, 8))])
def test_after_a_push_back_a_success_widens_with_chance_one_in_the_limit(draw, after):
    assert widened(Limit(3, 8), [draw], 16) == after


@pytest.mark.parametrize("draw, after", [(1 / 32 - 1e-9, Limit(5, 5)), (1 / 32, Limit(4, 5))])
def test_the_step_onto_the_limit_that_was_pushed_back_is_eight_times_rarer(draw, after):
    assert widened(Limit(4, 5), [draw], 16) == after


def test_past_the_ceiling_the_pace_is_one_step_per_round_again():
    assert widened(Limit(6, 5), [0.16], 16) == Limit(7, 5)


@pytest.mark.parametrize("result, narrowing", [
    (TIMED_OUT, True), (AttemptResult(False, None, "connection_error", "", 1), True), (refused(429), True),
    (refused(500), True), (refused(503), True), (refused(599), True), (refused(400), False), (refused(404), False),
    (refused(410), False), (AttemptResult(False, 302, "redirect", "", 1), False),
    (AttemptResult(False, None, "tls_error", "", 1), False), (AttemptResult(False, None, "internal_url", "", 1), False),
    (AttemptResult(False, None, "not_recorded", "", 0), False)])
def test_only_overload_or_unreachability_narrows(result, narrowing):
    assert narrows(result) is narrowing


AT = 1_800_000_000_000  # 2027-01-15T08:00:00Z


@pytest.mark.parametrize("result, until", [
    (refused(429, "5"), AT + 5000), (refused(503, " 7 "), AT + 7000), (refused(503, "3600"), AT + 60_000),
    (refused(429, format_datetime(datetime.fromtimestamp(AT / 1000 + 30, timezone.utc), usegmt=True)), AT + 30_000),
    (refused(429, "Fri, 15 Jan 2027 08:00:12 GMT"), AT + 12_000),
    (refused(429, "Fri, 15 Jan 2027 07:59:00 GMT"), None),  # already past
    (refused(429, "Fri, 15 Jan 2027 08:00:12"), None),  # no zone: not an HTTP date
    (refused(429, "0"), None), (refused(429, "-5"), None), (refused(429, "1.5"), None), (refused(429, "soon"), None),
    (refused(429, "9" * 100), None), (refused(429), None), (refused(500, "5"), None), (refused(502, "5"), None),
    (AttemptResult(True, 200, None, "", 1, retry_after="5"), None)])
def test_a_429_or_503_with_retry_after_holds_for_it_at_most_a_minute(result, until):
    assert hold_until(result, AT) == until


# --- the queue, stepped ---------------------------------------------------------------------------

def record(outcomes: list[tuple], at: int, draw: float = 1.0) -> None:
    """Record (claim, result) pairs together, as attempts finishing together are."""
    write_outcomes([Outcome(claim, result, at, at, 0.0, draw) for claim, result in outcomes], POLICY)


def limit_of(subscription) -> tuple:
    row = Subscription.get_by_id(subscription.id)
    return row.concurrency_limit, row.concurrency_ceiling


@pytest.mark.both_databases
def test_the_limit_widens_while_successes_meet_a_backlog_and_narrows_at_once_on_a_failure(organization):
    [subscription] = subscriptions(organization("acme"), 1)
    queued = [enqueue_ping(subscription) for _ in range(80)]
    taken, now = [], NOW
    for _ in range(5):  # each round: whatever the limit allows, all answered 200 together
        claims = claim_due(now, 64, LEASE)
        taken.append(len(claims))
        now += 200
        record([(claim, OK) for claim in claims], now)
    assert taken == [1, 2, 4, 8, 16]  # doubling, up to the most (16)
    claims = claim_due(now, 64, LEASE)
    assert len(claims) == 16
    record([(claims[0], TIMED_OUT)] + [(claim, OK) for claim in claims[1:]], now + 200)
    assert limit_of(subscription) == (12, 16)
    assert len(claim_due(now + 200, 64, LEASE)) == 12  # narrowed, not held: one failure alone
    delivered = Delivery.select().where(Delivery.state == "delivered").order_by(Delivery.seq)
    assert [d.event_id for d in delivered] == queued[:31] + queued[32:47]  # oldest first


def test_a_success_without_a_backlog_does_not_widen(organization):
    [subscription] = subscriptions(organization("acme"), 1)
    enqueue_ping(subscription)
    record([(claim, OK) for claim in claim_due(NOW, 64, LEASE)], NOW + 1)
    assert limit_of(subscription) == (1, None)


def test_a_success_below_the_limit_does_not_widen(organization):
    [subscription] = subscriptions(organization("acme"), 1)
    Subscription.update(concurrency_limit=4).execute()
    for _ in range(10):
        enqueue_ping(subscription)
    [claim, *others] = claim_due(NOW, 2, LEASE)  # the claim had 2 free slots: 2 in flight of 4
    record([(claim, OK)], NOW + 1)
    assert limit_of(subscription) == (4, None)


def test_after_a_push_back_the_limit_widens_by_chance(organization):
    [subscription] = subscriptions(organization("acme"), 1)
    Subscription.update(concurrency_limit=4, concurrency_ceiling=8).execute()
    for _ in range(20):
        enqueue_ping(subscription)
    claims = claim_due(NOW, 64, LEASE)
    record([(claims[0], OK)], NOW + 1, draw=0.26)  # 1 in 4 would have widened it; 0.26 does not
    assert limit_of(subscription) == (4, 8)
    assert len(claim_due(NOW + 1, 64, LEASE)) == 1  # held at its limit again
    record([(claims[1], OK)], NOW + 2, draw=0.2)
    assert limit_of(subscription) == (5, 8)


def pinned_backlog(org_id: str, pin: int, pings: int):
    """A subscription pinned to `pin` attempts in flight, with `pings` due pings."""
    [subscription] = subscriptions(org_id, 1)
    set_concurrency(subscription.id, pin)
    for _ in range(pings):
        enqueue_ping(subscription)
    return subscription


@pytest.mark.both_databases
def test_a_pinned_subscription_neither_widens_nor_narrows(organization):
    subscription = pinned_backlog(organization("acme"), 3, 20)
    claims = claim_due(NOW, 64, LEASE)
    assert len(claims) == 3
    record([(claims[0], OK), (claims[1], OK), (claims[2], TIMED_OUT)], NOW + 1, draw=0.0)
    assert len(claim_due(NOW + 1, 64, LEASE)) == 3
    assert limit_of(subscription) == (1, None)


@pytest.mark.both_databases
def test_pinned_to_one_the_deliveries_go_one_at_a_time_in_due_order(organization):
    [subscription] = subscriptions(organization("acme"), 1)
    set_concurrency(subscription.id, 1)
    queued = [enqueue_ping(subscription, NOW + offset % 3) for offset in range(30)]  # due times interleaved
    sent, now = [], NOW + 10
    while claims := claim_due(now, 64, LEASE):
        [claim] = claims
        sent.append(claim.event_id)
        record([(claim, OK)], now)
    assert sent == sorted(queued, key=lambda event_id: (queued.index(event_id) % 3, queued.index(event_id)))


@pytest.mark.both_databases
def test_the_most_configured_caps_a_limit_adapted_or_pinned_before_it(organization):
    [adapted, pinned] = subscriptions(organization("acme"), 2)
    Subscription.update(concurrency_limit=10).where(Subscription.id == adapted.id).execute()
    set_concurrency(pinned.id, 9)
    for subscription in (adapted, pinned):
        for _ in range(12):
            enqueue_ping(subscription)
    claims = claim_due(NOW, 64, LEASE, most=4)
    assert sorted(claim.subscription_id for claim in claims) == sorted([adapted.id] * 4 + [pinned.id] * 4)


@pytest.mark.both_databases
def test_retry_after_holds_the_other_due_deliveries_without_counting_them(organization):
    [subscription] = subscriptions(organization("acme"), 1)
    first, *held = [enqueue_ping(subscription) for _ in range(3)]
    [claim] = claim_due(NOW, 64, LEASE)
    record([(claim, refused(429, "5"))], NOW + 10)
    assert claim_due(NOW + 10 + 4999, 64, LEASE) == []
    assert not any_due(NOW + 10 + 4999)  # nothing for an idle process to look for again soon
    assert next_due_at(NOW + 10) == NOW + 10 + 5000  # the scanner wakes when the hold ends
    assert [(d.state, d.attempts, d.unrecorded) for d in Delivery.select().where(Delivery.event << held)] == [
        ("pending", 0, 0)] * 2
    assert [f.event_id for f in Failure.select()] == [first]  # the 429 itself: a failed attempt as any other
    assert [c.event_id for c in claim_due(NOW + 10 + 5000, 64, LEASE)] == [held[0]]  # narrowed: 1 at a time


def test_a_hold_is_never_shortened_by_a_shorter_one(organization):
    [subscription] = subscriptions(organization("acme"), 1)
    Subscription.update(concurrency_limit=2).execute()
    for _ in range(4):
        enqueue_ping(subscription)
    first, second = claim_due(NOW, 64, LEASE)
    record([(first, refused(503, "30"))], NOW + 10)
    record([(second, refused(429, "2"))], NOW + 20)
    assert Subscription.get_by_id(subscription.id).paused_until == NOW + 10 + 30_000


def test_a_500_with_retry_after_holds_only_for_the_failure_backoff(organization):
    [subscription] = subscriptions(organization("acme"), 1)
    for _ in range(4):
        enqueue_ping(subscription)
    [claim] = claim_due(NOW, 64, LEASE)
    record([(claim, refused(500, "30"))], NOW + 10)
    [claim] = claim_due(NOW + 10, 64, LEASE)  # one failure alone: not the 30 s it asked for
    record([(claim, refused(500, "30"))], NOW + 20)
    assert len(claim_due(NOW + 20 + FIRST_BACKOFF_MS, 64, LEASE)) == 1  # the second: its backoff, not 30 s


@pytest.mark.both_databases
def test_the_limit_holds_however_many_claim_at_once(organization):
    pinned_backlog(organization("acme"), 4, 100)
    taken = []
    claimers = [lambda: [taken.extend(claim_due(NOW, 64, LEASE)) for _ in range(5)] for _ in range(6)]

    def on_its_own_connection(claim):
        def run():
            with db.connection_context():
                claim()
        return run
    assert run_together(*map(on_its_own_connection, claimers)) == []
    assert len(taken) == 4  # never more, though each claimer had 64 slots


@pytest.mark.config(DELIVERY_MAX_PER_SUBSCRIPTION=4)
def test_the_gauge_counts_subscriptions_held_at_their_limit_or_paused(app, client):
    with app.app_context(), db.connection_context():  # closed before the scrape, which opens its own
        org = create_key("acme", ["webhooks:manage"], NOW).key.organization.id
        at_limit, paused, idle = subscriptions(org, 3)
        Subscription.update(concurrency_limit=2).where(Subscription.id == at_limit.id).execute()
        for subscription in (at_limit, at_limit, at_limit, paused, paused, idle):
            enqueue_ping(subscription)
        claims = claim_due(NOW, 64, LEASE, most=4)
        [held] = [claim for claim in claims if claim.subscription_id == paused.id]
        [sent] = [claim for claim in claims if claim.subscription_id == idle.id]
        record([(held, refused(429, "30")), (sent, OK)], NOW + 1)
    scraped = scrape(client)
    assert value(scraped, "partner_subscriptions_limited", reason="at_limit") == 1
    assert value(scraped, "partner_subscriptions_limited", reason="paused") == 1


# --- dispatchers and receivers ----------------------------------------------------------------------

@pytest.mark.config(WEBHOOK_ALLOWED_NETWORKS=["127.0.0.0/8"])
def test_a_receivers_retry_after_is_honoured_by_the_dispatcher(dispatcher, start_receiver, organization, clock):
    receiver = start_receiver(script=[too_many_after_retry_after(5), 200])
    [subscription] = subscriptions(organization("acme"), 1, receiver.url)
    queued = [enqueue_ping(subscription, int(clock() * 1000)) for _ in range(3)]
    assert dispatcher.run_due() == 1  # the 429; the others are held
    clock.advance(4.9)
    assert dispatcher.run_due() == 0
    clock.advance(0.1)
    assert dispatcher.run_due() == 2
    assert [r.headers["X-VC-Event-Id"] for r in receiver.received] == [queued[0], queued[1], queued[2]]


class Concurrent:
    """A receiver step that answers 200 after `seconds`, counting the requests under way at once."""

    def __init__(self, seconds: float):
        self.seconds, self.now, self.most = seconds, 0, 0
        self.lock, self.released = threading.Lock(), threading.Event()

    def __call__(self, handler):
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
        self.released.wait(self.seconds)
        with self.lock:
            self.now -= 1
        handler.send_response(200)
        handler.send_header("Content-Length", "0")
        handler.end_headers()


def dispatch_in_a_process(database_url: str, started, stop) -> None:
    """A separate service's dispatcher on the same database: its own app, scheduler and slots."""
    from tests.support import started_app
    app = started_app({"DATABASE_URL": database_url, "WEBHOOK_ALLOWED_NETWORKS": ["127.0.0.0/8"],
                       "DELIVERY_MAX_PER_SUBSCRIPTION": 4})
    dispatcher = app.extensions["delivery"]
    dispatcher.start()
    started.set()
    stop.wait(120)
    dispatcher.stop()


@pytest.mark.both_databases
@pytest.mark.parametrize("pin", [3, None], ids=["pinned to 3", "adaptive up to 4"])
def test_two_dispatchers_on_one_database_never_exceed_the_limit_at_the_receiver(database_url, organization,
                                                                                 start_receiver, pin):
    concurrent = Concurrent(0.05)
    receiver = start_receiver(script=[concurrent])
    [subscription] = subscriptions(organization("acme"), 1, receiver.url)
    if pin:
        set_concurrency(subscription.id, pin)
    context = multiprocessing.get_context("spawn")
    stop = context.Event()
    services = [(context.Process(target=dispatch_in_a_process, args=(database_url, started, stop)), started)
                for started in (context.Event(), context.Event())]
    for process, _ in services:
        process.start()
    try:
        assert all(started.wait(60) for _, started in services)
        for _ in range(80):  # due now for the other processes, whose clock is the real one
            enqueue_ping(subscription, int(time.time() * 1000))
        assert receiver.wait_for(80, seconds=60)
    finally:
        stop.set()
        for process, _ in services:
            process.join(30)
    assert len({r.headers["X-VC-Event-Id"] for r in receiver.received}) == 80
    assert concurrent.most == (pin or 4)  # reached, never passed


def hold_sqlite_write_lock(path: str) -> sqlite3.Connection:
    """Another connection holding SQLite's write lock, as an operator's shell might."""
    connection = sqlite3.connect(path, isolation_level=None)
    connection.execute("BEGIN IMMEDIATE")
    return connection


def gated(gate: threading.Event):
    """A receiver step that answers 200 once `gate` is set."""
    def step(handler):
        gate.wait(10)
        handler.send_response(200)
        handler.send_header("Content-Length", "0")
        handler.end_headers()
    return step


def refuse_to_record(outcome):
    raise RuntimeError("not recorded")  # at once: the attempt's slot is freed while the database is locked


@pytest.mark.config(SCHEDULER_ENABLED=True, WEBHOOK_ALLOWED_NETWORKS=["127.0.0.0/8"], DELIVERY_POLL_INTERVAL=60,
                    DELIVERY_CONCURRENCY=4)
def test_wakes_during_long_scans_are_kept_and_make_the_scheduler_warn_nothing(dispatcher, database, database_url,
                                                                             organization, start_receiver, caplog):
    """Scans held up by a locked database while attempts end and pings wake the scanner: before, each
    wake started another scan beside those waiting, until APScheduler refused one with a warning."""
    caplog.set_level(logging.INFO, logger="apscheduler")
    gates = [threading.Event(), threading.Event()]
    slow, fast = start_receiver(script=[gated(gates[0]), gated(gates[1])]), start_receiver()
    org = organization("acme")
    for subscription in subscriptions(org, 2, slow.url):
        enqueue_ping(subscription)
    dispatcher.courier.record, dispatcher.courier.record_pauses = refuse_to_record, ()
    dispatcher.start()
    assert slow.wait_for(2)  # two of the four slots in flight
    [waiting] = subscriptions(org, 1, fast.url)
    enqueue_ping(waiting)
    lock = hold_sqlite_write_lock(database_url.removeprefix("sqlite:///"))
    try:
        for wakes, gate in enumerate(gates, 2):  # a scan waits for the lock; an attempt ends and frees its slot
            dispatcher.wake()
            assert eventually(lambda: runs_of_the_scan(caplog) == wakes)
            gate.set()
            assert eventually(lambda: caplog.text.count("delivery attempt crashed") == wakes - 1)
        dispatcher.wake()
        assert eventually(lambda: runs_of_the_scan(caplog) == 4)
    finally:
        lock.rollback()
        lock.close()
    assert fast.wait_for(1)
    assert "maximum number of running instances" not in caplog.text


def runs_of_the_scan(caplog) -> int:
    """How many runs of the scan job the scheduler started or refused."""
    return sum(1 for record in caplog.records if record.name.startswith("apscheduler") and "scan" in
               record.getMessage() and ("Running job" in record.getMessage() or "skipped" in record.getMessage()))


@pytest.mark.config(SCHEDULER_ENABLED=True, WEBHOOK_ALLOWED_NETWORKS=["127.0.0.0/8"], DELIVERY_POLL_INTERVAL=60,
                    DELIVERY_CONCURRENCY=1)
@pytest.mark.parametrize("brief_busy_timeout", [20_000], indirect=True)  # the claim waits out the test's steps
def test_a_stop_during_an_outage_counts_as_unrecorded_only_attempts_that_were_made(
        brief_busy_timeout, dispatcher, database, database_url, organization, start_receiver, clock):
    """The worker stops while the database is locked from outside and a scan's claim waits for it. Before,
    that claim committed once the lock was let go, found the pool shut down, and gave its delivery back;
    the database refused the give-back (the outage again), so the delivery's lease ran out and the next
    claim counted an attempt never made as one whose outcome was lost. Now the stop waits for the claim,
    and every delivery claimed is attempted: what is counted is what the receiver saw unrecorded."""
    gate = threading.Event()
    receiver = start_receiver(script=[gated(gate)])
    first, second = subscriptions(organization("acme"), 2, receiver.url)
    attempted = enqueue_ping(first)
    dispatcher.courier.record, dispatcher.courier.record_pauses = refuse_to_record, ()  # no outcome is written
    dispatcher.start()
    assert receiver.wait_for(1)  # the one slot busy
    claimed = enqueue_ping(second)
    # Once the lock is let go, the database still refuses what gives a claim back (pending again).
    refuse_in_sqlite("UPDATE OF state ON delivery WHEN NEW.state = 'pending'")
    lock = hold_sqlite_write_lock(database_url.removeprefix("sqlite:///"))
    try:
        gate.set()  # the attempt ends, unrecorded, and its slot's refill scan waits for the lock
        assert eventually(lambda: running("claim_due"))
        stopping = threading.Thread(target=dispatcher.stop)
        stopping.start()
        assert eventually(lambda: waiting_after_the_jobs(stopping))
    finally:
        lock.rollback()
        lock.close()
    stopping.join(timeout=30)
    assert not stopping.is_alive()
    allow_in_sqlite()
    clock.advance(dispatcher.courier.lease_ms / 1000)  # every lease has run out
    claim_due(int(clock() * 1000), 8, LEASE)
    seen = Counter(request.headers["X-VC-Event-Id"] for request in receiver.received)
    assert {event_id: delivery_of(event_id).unrecorded for event_id in (attempted, claimed)} == {
        attempted: 1, claimed: seen[claimed]}
    assert seen[claimed] == 1  # claimed before the stop: attempted, not given back


def running(function: str) -> bool:
    """Whether a thread of this process is inside a function of that name now."""
    return any(function in names(frame) for frame in sys._current_frames().values())


def waiting_after_the_jobs(thread: threading.Thread) -> bool:
    """Whether the dispatcher's stop, in `thread`, has stopped the scheduler and now waits (for the
    claims and attempts under way)."""
    frame = sys._current_frames().get(thread.ident)
    return (frame is not None and frame.f_code.co_name in ("wait", "_wait_for_tstate_lock")
            and not any("apscheduler" in name or name.endswith("jobs.py") for name in files(frame)))


def names(frame) -> set[str]:
    return {f.f_code.co_name for f in stack(frame)}


def files(frame) -> set[str]:
    return {f.f_code.co_filename for f in stack(frame)}


def stack(frame):
    while frame is not None:
        yield frame
        frame = frame.f_back


# --- a failing endpoint is held, not hammered -----------------------------------------------------

@pytest.mark.parametrize("failures, wait_ms", [(2, 1_000), (3, 2_000), (4, 4_000), (7, 32_000), (8, 60_000),
                                               (20, 60_000), (10_000, 60_000)])
def test_the_backoff_doubles_with_the_failures_in_a_row_up_to_a_minute(failures, wait_ms):
    assert backoff_until(failures, NOW) == NOW + wait_ms
    assert MAX_BACKOFF_MS == 60_000


def test_one_failure_alone_holds_nothing():
    assert backoff_until(1, NOW) is None


@pytest.mark.both_databases
def test_after_a_second_failure_in_a_row_nothing_more_is_sent_until_the_backoff_ends(organization):
    [subscription] = subscriptions(organization("acme"), 1)
    for _ in range(6):
        enqueue_ping(subscription)
    [claim] = claim_due(NOW, 64, LEASE)
    record([(claim, TIMED_OUT)], NOW + 10)
    [claim] = claim_due(NOW + 10, 64, LEASE)  # one failure alone holds nothing
    record([(claim, TIMED_OUT)], NOW + 20)
    assert claim_due(NOW + 20 + FIRST_BACKOFF_MS - 1, 64, LEASE) == []
    [probe] = claim_due(NOW + 20 + FIRST_BACKOFF_MS, 64, LEASE)
    record([(probe, TIMED_OUT)], NOW + 30 + FIRST_BACKOFF_MS)
    assert claim_due(NOW + 30 + 3 * FIRST_BACKOFF_MS - 1, 64, LEASE) == []  # the third waits twice as long
    [probe] = claim_due(NOW + 30 + 3 * FIRST_BACKOFF_MS, 64, LEASE)
    record([(probe, OK)], NOW + 40 + 3 * FIRST_BACKOFF_MS)
    assert len(claim_due(NOW + 41 + 3 * FIRST_BACKOFF_MS, 64, LEASE)) == 1  # a success holds nothing
