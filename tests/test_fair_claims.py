"""Which deliveries a claim takes (claims.py): each subscription's oldest first, nothing written back
that it does not keep, slots shared among organizations, and attempts that never record counted.
The claim is stepped by hand on the real database; one test sends a real backlog to a receiver."""

import random
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest
from peewee import IntegrityError

from models import Delivery, Event, Failure, Organization, Subscription, db
from partner.claims import pick_due
from partner.history import replay_dead_letters
from partner.events import enqueue_test_ping
from partner.claims import MAX_UNRECORDED
from partner.outbox import claim_due, put_off
from partner.outbound.transport import AttemptResult
from partner.retry import RetryPolicy
from partner.store.sql import run_sql
from partner.subscriptions import create_subscription, secret_of, set_concurrency
from tests.receivers import hang
from tests.support import (counting_scans, delivery_of, eventually, queue_in_bulk, record_attempt, refuse_in_sqlite,
                           sealed)

NOW = 1_800_000_000_123
LEASE = 40_000
URL = "http://93.184.215.14/hook"  # never contacted by the stepped tests
POLICY = RetryPolicy([60, 300], 20)
CLOCK_START = NOW / 1000


def subscriptions(org_id: str, count: int, url: str = URL) -> list[Subscription]:
    return [create_subscription(org_id, url, None, NOW) for _ in range(count)]


def enqueue_ping(subscription, at: int = NOW) -> str:
    return enqueue_test_ping(subscription, "KEYID", at).id


def deliver(claim, at: int = NOW) -> None:
    record_attempt(claim, AttemptResult(True, 200, None, "", 1), at, at + 1, POLICY, jitter=0)


def inversions(order: list[int]) -> int:
    return sum(1 for i, a in enumerate(order) for b in order[i + 1:] if a > b)


# --- order ------------------------------------------------------------------------------------

@pytest.mark.both_databases
def test_pings_queued_in_the_same_millisecond_are_claimed_in_enqueue_order(organization):
    [subscription] = subscriptions(organization("acme"), 1)
    queued = [enqueue_ping(subscription) for _ in range(20)]
    claimed = []
    while claims := claim_due(NOW, 64, LEASE):  # more at a time as the limit widens
        claimed += [claim.event_id for claim in claims]
        for claim in claims:
            deliver(claim)
    assert claimed == queued


def test_a_claim_writes_back_nothing_it_does_not_keep(organization):
    [subscription] = subscriptions(organization("acme"), 1)
    queued = [enqueue_ping(subscription, NOW + offset) for offset in range(5)]
    before = {d.event_id: (d.state, d.due_at, d.lease_token) for d in Delivery.select()}
    [claim] = claim_due(NOW + 100, 64, LEASE)
    assert claim.event_id == queued[0]
    after = {d.event_id: (d.state, d.due_at, d.lease_token) for d in Delivery.select()}
    assert {event_id for event_id in queued if after[event_id] != before[event_id]} == {queued[0]}


def test_a_retry_due_later_lets_the_deliveries_due_before_it_go_first(organization):
    [subscription] = subscriptions(organization("acme"), 1)
    first, second = enqueue_ping(subscription), enqueue_ping(subscription)
    [claim] = claim_due(NOW, 64, LEASE)
    record_attempt(claim, AttemptResult(False, 500, "http_status", "", 1), NOW, NOW + 1, POLICY, 0)
    assert [c.event_id for c in claim_due(NOW + 1, 64, LEASE)] == [second]
    first_row = delivery_of(first)
    assert (first_row.state, first_row.due_at) == ("pending", NOW + 1 + 60_000)


@pytest.mark.both_databases
@pytest.mark.config(SCHEDULER_ENABLED=True, WEBHOOK_ALLOWED_NETWORKS=["127.0.0.0/8"])
def test_a_backlog_of_500_pings_pinned_to_one_in_flight_reaches_the_receiver_in_order(dispatcher, database,
                                                                                      organization, receiver):
    [subscription] = subscriptions(organization("acme"), 1, receiver.url)
    set_concurrency(subscription.id, 1)
    queued = [enqueue_ping(subscription) for _ in range(500)]  # all due in the same millisecond
    dispatcher.start()
    assert receiver.wait_for(500, seconds=120)
    arrived = [queued.index(r.headers["X-VC-Event-Id"]) for r in receiver.received]
    assert inversions(arrived) == 0
    assert arrived == list(range(500))


# --- fair share -------------------------------------------------------------------------------

@pytest.mark.both_databases
def test_an_organization_with_one_due_subscription_gets_a_slot_beside_one_with_a_hundred(organization):
    crowd, single = organization("crowd"), organization("single")
    for subscription in subscriptions(crowd, 100):
        enqueue_ping(subscription, NOW)
    [lone] = subscriptions(single, 1)
    lone_ping = enqueue_ping(lone, NOW + 50)  # due last
    claimed = [claim.event_id for claim in claim_due(NOW + 100, 8, LEASE)]
    assert len(claimed) == 8
    assert lone_ping in claimed


def test_an_organization_alone_takes_every_slot(organization):
    for subscription in subscriptions(organization("crowd"), 12):
        enqueue_ping(subscription)
    assert len(claim_due(NOW, 8, LEASE)) == 8


@pytest.mark.both_databases
def test_an_organization_holding_slots_waits_for_the_others_to_catch_up(organization):
    crowd, few = organization("crowd"), organization("few")
    for subscription in subscriptions(crowd, 10):
        enqueue_ping(subscription, NOW)
    assert len(claim_due(NOW, 4, LEASE)) == 4  # the crowd alone: it holds 4 slots now
    late = [enqueue_ping(subscription, NOW + 10) for subscription in subscriptions(few, 3)]
    # The crowd's next turn is its 5th slot; the others' turns are 1, 2, 3: theirs go first.
    claimed = [claim.event_id for claim in claim_due(NOW + 20, 4, LEASE)]
    assert set(claimed[:3]) == set(late)
    assert len(claimed) == 4


@pytest.mark.both_databases
def test_a_newcomer_need_not_wait_for_the_slots_another_organization_holds(organization):
    """Slow receivers: one organization fills every slot of the process (8) with long attempts. Another
    organization's deliveries are given slots beyond them at once, up to its share (8 ÷ 2), while the
    first is given none beyond its share."""
    slow, newcomer = organization("slow"), organization("newcomer")
    for subscription in subscriptions(slow, 12):
        enqueue_ping(subscription, NOW)
    assert len(claim_due(NOW, 8, LEASE, slots=8)) == 8  # alone: every slot
    late = [enqueue_ping(subscription, NOW + 10) for subscription in subscriptions(newcomer, 6)]
    newcomers = claim_due(NOW + 20, 8, LEASE, slots=8, spare=0)
    claimed = [claim.event_id for claim in newcomers]
    assert len(claimed) == 4 and set(claimed) <= set(late)
    assert all(claim.beyond for claim in newcomers)  # each claims again as it ends (delivery.py)
    # With none waiting, the one holding more than its share is given spare slots only.
    claim_due(NOW + 20, 8, LEASE, slots=8, spare=0)
    assert claim_due(NOW + 30, 8, LEASE, slots=8, spare=0) == []
    [spare] = claim_due(NOW + 30, 8, LEASE, slots=8, spare=1)
    assert not spare.beyond


@pytest.mark.both_databases
def test_failing_subscriptions_keep_their_cap_within_the_share(organization):
    crowd, single = organization("crowd"), organization("single")
    for subscription in subscriptions(crowd, 6):
        enqueue_ping(subscription)
    [lone] = subscriptions(single, 1)
    enqueue_ping(lone, NOW + 1)
    Subscription.update(consecutive_failures=1).execute()  # every one failed its last attempt
    claimed = claim_due(NOW + 10, 8, LEASE, failing_limit=2)
    assert len(claimed) == 2
    assert lone.id in {claim.subscription_id for claim in claimed}


# --- the rule as a whole -------------------------------------------------------------------------

def expected_pick(subscriptions: dict, deliveries: list[dict], now: int, limit: int, failing_limit: int,
                  most: int, slots: int, spare: int) -> list[str]:
    """partner/queue.py's docstring, run in Python over plain rows: the event ids pick_due must answer."""
    leased = [d for d in deliveries if d["state"] == "in_flight" and d["due_at"] > now]
    flying = Counter(d["subscription"] for d in leased)
    held = Counter(subscriptions[d["subscription"]]["organization"] for d in leased)
    candidates = []
    for sid, sub in subscriptions.items():
        paused = sub["paused_until"] is not None and sub["paused_until"] > now
        allowance = 0 if paused else min(sub["concurrency_pin"] or sub["concurrency_limit"], most)
        due = sorted((d for d in deliveries if d["subscription"] == sid and d["state"] in ("pending", "in_flight")
                      and d["due_at"] <= now), key=lambda d: (d["due_at"], d["seq"], d["event"]))
        if sub["deleted_at"] is None:
            candidates += [{"org": sub["organization"], "failing": sub["consecutive_failures"] > 0,
                            "place": flying[sid] + nth, "due_at": d["due_at"], "event_id": d["event"]}
                           for nth, d in enumerate(due[:max(0, min(allowance - flying[sid], limit))], 1)]
    for org in {candidate["org"] for candidate in candidates}:
        for rank, candidate in enumerate(sorted((c for c in candidates if c["org"] == org),
                                                key=lambda c: (c["place"], c["due_at"], c["event_id"])), 1):
            candidate["turn"] = held[org] + rank
    order = sorted(candidates, key=lambda c: (c["turn"], c["due_at"], c["event_id"]))
    failing = [c for c in order if c["failing"]]
    admitted = [c for c in order if not c["failing"] or c in failing[:failing_limit]]
    busy = set(held) | {c["org"] for c in candidates}
    share = -(-slots // len(busy)) if busy else 0
    return [c["event_id"] for nth, c in enumerate(admitted, 1) if nth <= spare or c["turn"] <= share][:limit]


def random_state(rng: random.Random, most_subscriptions: int = 8) -> tuple[dict, list[dict]]:
    """Up to 3 organizations and `most_subscriptions` subscriptions (some failing, some deleted, some
    held for a Retry-After, with limits adapted or pinned), each with up to 5 deliveries: pending,
    in flight under a live or an expired lease, delivered or dead; due times drawn from a few
    values, so that heads tie."""
    subscriptions = {f"wh_{n}": {"id": f"wh_{n}", "organization": f"org_{rng.randrange(3)}",
                                 "consecutive_failures": rng.choice([0, 0, 1]), "created_at": NOW,
                                 "deleted_at": NOW if rng.random() < 0.15 else None, "url": URL,
                                 "concurrency_limit": rng.choice([1, 1, 2, 3, 5]),
                                 "concurrency_pin": rng.choice([None, None, None, 1, 2]),
                                 "paused_until": rng.choice([None, None, None, NOW - 1, NOW + 1]),
                                 **sealed(f"wh_{n}", "whsec_x")} for n in range(rng.randint(1, most_subscriptions))}
    deliveries = [{"event": f"evt_{rng.getrandbits(64):016x}", "subscription": sid, "seq": seq,
                   "state": rng.choice(["pending", "pending", "in_flight", "delivered", "dead"]),
                   "due_at": NOW + rng.randint(-3, 3)}
                  for sid in subscriptions for seq in range(1, rng.randint(1, 5) + 1)]
    return subscriptions, deliveries


def describe(subscriptions: dict, deliveries: list[dict], now: int) -> str:
    """A failing state, briefly: times relative to `now`."""
    subs = [(s["id"], s["organization"], s["consecutive_failures"], s["deleted_at"] is not None,
             s["concurrency_limit"], s["concurrency_pin"], s["paused_until"] and s["paused_until"] - now)
            for s in subscriptions.values()]
    rows = [(d["event"], d["subscription"], d["state"], d["due_at"] - now, d["seq"]) for d in deliveries]
    return (f"subscriptions (id, org, failures, deleted, limit, pin, paused for) {subs}; "
            f"deliveries (id, subscription, state, due in, seq) {rows}")


@pytest.mark.both_databases
@pytest.mark.parametrize("most_subscriptions, rounds", [(8, 150), (40, 40)], ids=["few", "crowded"])
def test_every_claim_follows_the_rule_on_random_backlogs(database, backend, most_subscriptions, rounds):
    """Crowded: more subscriptions with due work than a claim has slots, so the walk's bounds
    (claims.py) leave most of them out."""
    rng = random.Random(20261126)
    for _ in range(rounds if backend == "sqlite" else rounds // 4):
        subscriptions, deliveries = random_state(rng, most_subscriptions)
        with db.atomic():
            for model in (Delivery, Event, Subscription, Organization):
                model.delete().execute()
            Organization.insert_many([{"id": f"org_{n}", "slug": f"org-{n}", "created_at": NOW}
                                      for n in range(3)]).execute()
            Subscription.insert_many(list(subscriptions.values())).execute()
            Event.insert_many([{"id": d["event"], "kind": "k", "data": b"{}", "occurred_at": NOW,
                                "created_at": NOW} for d in deliveries]).execute()
            Delivery.insert_many(deliveries).execute()
        for now, limit, failing_limit, most in [(NOW, 8, 8, 16), (NOW + 1, rng.randint(1, 4), rng.randint(0, 2), 16),
                                                (NOW, rng.randint(2, 8), rng.randint(0, 4), rng.randint(1, 3))]:
            slots, spare = rng.choice([(limit, limit), (rng.randint(1, 8), rng.randint(0, limit))])
            picked = [pick.event_id for pick in pick_due(now, limit, failing_limit, most, slots, spare)]
            assert picked == expected_pick(subscriptions, deliveries, now, limit, failing_limit, most, slots,
                                           spare), describe(subscriptions, deliveries, now) + f"; {slots=} {spare=}"


# --- attempts whose outcome is never recorded ---------------------------------------------------

@pytest.mark.both_databases
def test_an_attempt_never_recorded_is_counted_and_the_bound_dead_letters_it(organization):
    [subscription] = subscriptions(organization("acme"), 1)
    event_id = enqueue_ping(subscription)
    now = NOW
    for lost in range(MAX_UNRECORDED):  # claimed, attempted, and the outcome never written
        [claim] = claim_due(now, 8, LEASE)
        assert claim.attempt == 1
        assert delivery_of(event_id).unrecorded == lost
        now += LEASE
    assert claim_due(now, 8, LEASE) == []
    delivery = delivery_of(event_id)
    assert (delivery.state, delivery.unrecorded, delivery.due_at) == ("dead", MAX_UNRECORDED, None)
    [failure] = Failure.select()
    assert (failure.error, failure.attempt, failure.http_status, failure.next_attempt_at) == (
        "not_recorded", 1, None, None)
    assert Subscription.get_by_id(subscription.id).consecutive_failures == 1


def test_a_replayed_not_recorded_dead_letter_is_attempted_with_a_fresh_budget(organization):
    [subscription] = subscriptions(organization("acme"), 1)
    event_id = enqueue_ping(subscription)
    now = NOW
    for _ in range(MAX_UNRECORDED + 1):  # the last claim dead-letters it, not_recorded
        claim_due(now, 8, LEASE)
        now += LEASE
    assert replay_dead_letters(subscription.id, now) == 1
    [claim] = claim_due(now, 8, LEASE)
    assert (claim.event_id, claim.attempt) == (event_id, 1)
    assert delivery_of(event_id).unrecorded == 0
    assert Failure.select().count() == 1  # only the first dead letter's


def test_giving_a_claim_back_does_not_count_it_as_unrecorded(organization):
    [subscription] = subscriptions(organization("acme"), 1)
    event_id = enqueue_ping(subscription)
    [claim] = claim_due(NOW, 8, LEASE)
    assert put_off(claim, NOW)
    claim_due(NOW, 8, LEASE)
    assert delivery_of(event_id).unrecorded == 0


def claimed_ping(org_id: str) -> tuple:
    """A new subscription of the organization with one ping, claimed at NOW: (subscription, claim)."""
    [subscription] = subscriptions(org_id, 1)
    enqueue_ping(subscription)
    [claim] = claim_due(NOW, 8, LEASE)
    return subscription, claim


def expired_and_next(subscription) -> tuple:
    """Two claims of one subscription that both still hold their lease: the first's has expired
    (not claimed again yet), and the second is a ping queued before it expired, so claimed first."""
    enqueue_ping(subscription)
    [expired] = claim_due(NOW, 8, LEASE)
    queued = enqueue_ping(subscription, NOW + 1)
    [claim] = claim_due(NOW + LEASE + 1, 8, LEASE)
    assert claim.event_id == queued
    return expired, claim


@pytest.mark.both_databases
def test_giving_back_a_claim_dead_lettered_meanwhile_leaves_it_dead(organization):
    late, claim = expired_and_next(subscriptions(organization("acme"), 1)[0])
    record_attempt(late, AttemptResult(False, 500, "http_status", "", 1), NOW, NOW + LEASE + 2,
                   RetryPolicy([60], 1), jitter=0)  # auto-disables: every open delivery dead-lettered
    assert not put_off(claim, NOW + LEASE + 3)
    assert delivery_of(claim.event_id).state == "dead"


@pytest.mark.both_databases
def test_a_secret_that_does_not_open_holds_back_its_subscription_alone(organization, caplog):
    good, broken = subscriptions(organization("acme"), 2)
    sent = enqueue_ping(good)
    held = [enqueue_ping(broken) for _ in range(3)]
    # The secret no longer opens (sealed for another subscription), as under a key this process lacks.
    Subscription.update(secret_sealed=good.secret_sealed).where(Subscription.id == broken.id).execute()
    assert [claim.event_id for claim in claim_due(NOW, 8, LEASE)] == [sent]
    assert claim_due(NOW + 1, 8, LEASE) == []  # the next scan does not take the next one
    assert {(d.state, d.lease_token, d.due_at, d.unrecorded) for d in Delivery.select().where(Delivery.event << held)} == {
        ("pending", None, NOW + LEASE, 0)}  # not counted: nothing was sent
    assert caplog.text.count("not attempted") == 1
    assert f"delivery of {held[0]} to {broken.id} not attempted" in caplog.text
    assert secret_of(broken) not in caplog.text


@pytest.mark.parametrize("backend", ["postgresql"], indirect=True)
def test_a_claim_cut_off_between_taking_and_reading_takes_nothing(organization):
    [subscription] = subscriptions(organization("acme"), 1)
    event_id = enqueue_ping(subscription)
    with ThreadPoolExecutor(1) as claimer:
        with db.atomic():  # the claim's read of the event waits for this lock; its backend is then ended
            db.execute_sql("LOCK TABLE event IN ACCESS EXCLUSIVE MODE")
            claiming = claimer.submit(claim_due, NOW, 8, LEASE)
            run_sql("SELECT pg_terminate_backend(:pid)", {"pid": waiting_for_a_lock()})
        with pytest.raises(Exception):  # noqa: B017 - whatever the driver makes of a lost connection
            claiming.result(timeout=10)
    delivery = delivery_of(event_id)
    assert (delivery.state, delivery.lease_token, delivery.unrecorded) == ("pending", None, 0)


def waiting_for_a_lock() -> int:
    """The process id of the one PostgreSQL backend waiting for a lock, once it waits."""
    def waiting() -> list:
        db.execute_sql("SELECT pg_stat_clear_snapshot()")  # else a transaction sees the same activity
        return db.execute_sql("SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock'").fetchall()
    assert eventually(waiting), "no backend waits for a lock"
    [(pid,)] = waiting()
    return pid


def test_a_claim_that_fails_while_settling_takes_nothing(organization):
    [subscription] = subscriptions(organization("acme"), 1)
    event_id = enqueue_ping(subscription)
    for lost in range(MAX_UNRECORDED):  # claimed, and the outcome never written
        claim_due(NOW + lost * LEASE, 8, LEASE)
    before = delivery_of(event_id)
    refuse_in_sqlite("INSERT ON failure")  # the not_recorded failure record cannot be written
    with pytest.raises(IntegrityError):
        claim_due(NOW + MAX_UNRECORDED * LEASE, 8, LEASE)
    after = delivery_of(event_id)
    assert (after.state, after.lease_token, after.unrecorded) == (before.state, before.lease_token, before.unrecorded)


class RecordRefused(Exception):
    """What the record step raises, every time, in the test below."""


def refuse(*args):
    raise RecordRefused("the outcome cannot be written")


@pytest.mark.config(WEBHOOK_ALLOWED_NETWORKS=["127.0.0.0/8"], AUTO_DISABLE_THRESHOLD=1)
def test_a_record_step_that_always_fails_ends_in_a_not_recorded_dead_letter(dispatcher, clock, database,
                                                                           organization, receiver):
    dispatcher.courier.record, dispatcher.courier.record_pauses = refuse, ()  # the seams: never written, no retry
    [subscription] = subscriptions(organization("acme"), 1, receiver.url)
    event_id = enqueue_ping(subscription, int(clock() * 1000))
    for _ in range(MAX_UNRECORDED):
        with pytest.raises(RecordRefused):
            dispatcher.run_due()
        clock.advance(dispatcher.courier.lease_ms / 1000)  # the lease expires: the attempt was never recorded
    assert dispatcher.run_due() == 0  # dead-lettered by the claim, not sent a fourth time
    assert [r.headers["X-VC-Event-Id"] for r in receiver.received] == [event_id] * MAX_UNRECORDED
    assert delivery_of(event_id).state == "dead"
    assert [f.error for f in Failure.select()] == ["not_recorded"]
    subscription = Subscription.get_by_id(subscription.id)
    assert (subscription.active, subscription.consecutive_failures) == (False, 1)  # counted: threshold 1


@pytest.mark.config(SCHEDULER_ENABLED=True, WEBHOOK_ALLOWED_NETWORKS=["127.0.0.0/8"], DELIVERY_CONCURRENCY=4,
                    DELIVERY_POLL_INTERVAL=60, DELIVERY_TIMEOUT=60)
def test_a_ping_queued_while_every_slot_is_busy_takes_the_first_slot_that_frees(dispatcher, database, organization,
                                                                                start_receiver):
    crowd, quiet = organization("crowd"), organization("quiet")
    # The slow ones answer nothing until the test ends, and the next poll is a minute away.
    slow, brief, fast = (start_receiver(script=[hang(60)]), start_receiver(script=[hang(0.3)]),
                         start_receiver())
    for subscription in subscriptions(crowd, 3, slow.url) + subscriptions(crowd, 1, brief.url):
        enqueue_ping(subscription)
    [lone] = subscriptions(quiet, 1, fast.url)
    dispatcher.start()
    assert slow.wait_for(3) and brief.wait_for(1)  # all 4 slots busy
    enqueue_ping(lone)
    dispatcher.wake()
    # One slot frees after 0.3 s, fewer than the refill batch (2 of 4): it is refilled anyway.
    assert fast.wait_for(1)


@pytest.mark.config(SCHEDULER_ENABLED=True, WEBHOOK_ALLOWED_NETWORKS=["127.0.0.0/8"], DELIVERY_CONCURRENCY=4,
                    DELIVERY_POLL_INTERVAL=60, DELIVERY_TIMEOUT=60)
def test_a_ping_of_another_organization_goes_out_while_one_holds_every_slot(dispatcher, database, organization,
                                                                            start_receiver):
    """Slow receivers: the crowd's attempts hold all 4 slots until the test ends. The quiet
    organization's pings are given threads beyond them (it holds less than its share), one after
    another (its subscription's limit is 1), not at the next poll; the crowd is given none beyond its
    share."""
    crowd, quiet = organization("crowd"), organization("quiet")
    slow, fast = start_receiver(script=[hang(60)] * 8), start_receiver()
    for subscription in subscriptions(crowd, 6, slow.url):
        enqueue_ping(subscription)
    [lone] = subscriptions(quiet, 1, fast.url)
    dispatcher.start()
    assert slow.wait_for(4)  # every slot busy
    for _ in range(3):
        enqueue_ping(lone)
    dispatcher.wake()
    assert fast.wait_for(3)
    assert len(slow.received) == 4


# --- a backlog held by another process -------------------------------------------------------

def claim_elsewhere(now_ms: int, limit: int) -> int:
    """Claim as another process would, this dispatcher knowing nothing of it, and never record the
    attempts (that process died): how many it claimed."""
    with db.connection_context():
        return len(claim_due(now_ms, limit, LEASE))


@pytest.mark.config(SCHEDULER_ENABLED=True, WEBHOOK_ALLOWED_NETWORKS=["127.0.0.0/8"], DELIVERY_POLL_INTERVAL=60)
def test_an_idle_process_takes_up_a_backlog_another_holds_soon_not_at_the_next_poll(dispatcher, clock, organization,
                                                                                    receiver):
    [subscription] = subscriptions(organization("acme"), 1, receiver.url)
    queued = [enqueue_ping(subscription, NOW) for _ in range(2)]
    assert claim_elsewhere(NOW, 1) == 1  # the first, under its lease
    scans = counting_scans(dispatcher)
    dispatcher.start()
    assert eventually(lambda: len(scans) >= 2)  # its first scans find the backlog behind the other's attempt
    assert receiver.received == []
    clock.advance(LEASE / 1000)  # that attempt's lease ends: its outcome was never recorded
    assert receiver.wait_for(2)  # the next poll is a minute away
    # The attempt cut short is due again when its lease ended, after the ping queued behind it.
    assert [r.headers["X-VC-Event-Id"] for r in receiver.received] == queued[::-1]


@pytest.mark.config(SCHEDULER_ENABLED=True, WEBHOOK_ALLOWED_NETWORKS=["127.0.0.0/8"], DELIVERY_POLL_INTERVAL=1)
def test_a_process_idle_for_a_while_takes_up_a_backlog_another_holds_soon_after(dispatcher, clock, organization,
                                                                               receiver):
    """While nothing is due an idle process waits for the poll, and its next wait behind another
    process's attempts starts short again: it does not stay at the poll interval it grew to."""
    [subscription] = subscriptions(organization("acme"), 1, receiver.url)
    scans = counting_scans(dispatcher)
    dispatcher.start()
    assert eventually(lambda: len(scans) >= 2)  # idle past a poll: the start's scan and a poll's, both of nothing
    queued = [enqueue_ping(subscription, NOW) for _ in range(2)]
    assert claim_elsewhere(NOW, 1) == 1  # the first, under its lease
    idle_scans = len(scans)
    dispatcher.wake()  # as an enqueue here would: its scan finds the backlog held
    assert eventually(lambda: len(scans) > idle_scans)
    assert receiver.received == []
    clock.advance(LEASE / 1000)  # that attempt's lease ends
    assert receiver.wait_for(2, seconds=0.75)  # soon, not at a wait grown to the poll (1 s)
    assert [r.headers["X-VC-Event-Id"] for r in receiver.received] == queued[::-1]


def waiting_a_day(org_id: str, count: int) -> None:
    """`count` subscriptions whose one delivery is due in a day: every claim's walk visits each of
    them (claims.py), so each scan takes milliseconds and scans started together overlap."""
    queue_in_bulk(org_id, [f"evt_far{n:05d}" for n in range(count)], NOW + 86_400_000, NOW)


@pytest.mark.config(SCHEDULER_ENABLED=True, WEBHOOK_ALLOWED_NETWORKS=["127.0.0.0/8"], DELIVERY_POLL_INTERVAL=60,
                    DELIVERY_CONCURRENCY=4)
def test_attempts_ending_together_leave_no_process_idle_until_the_next_poll(dispatcher, clock, organization,
                                                                           receiver, start_receiver):
    """Attempts ending together: each frees its slot while another's refill scan holds the rest, so
    no scan reserves every slot, yet the last to give its slots back leaves nothing in flight here.
    It must scan again soon: here the backlog another process held comes free meanwhile."""
    gate = threading.Event()

    def gated(handler):
        gate.wait(10)
        handler.send_response(200)
        handler.send_header("Content-Length", "0")
        handler.end_headers()

    together = start_receiver(script=[gated])
    org = organization("acme")
    [held] = subscriptions(org, 1, receiver.url)
    queued = [enqueue_ping(held) for _ in range(2)]
    assert claim_elsewhere(NOW, 1) == 1  # the first of these, under its lease
    for subscription in subscriptions(org, 4, together.url):
        enqueue_ping(subscription)
    waiting_a_day(org, 3000)
    scans = counting_scans(dispatcher)
    dispatcher.start()
    assert together.wait_for(4)  # every slot in flight
    gate.set()
    # Their outcomes are recorded; their refill scans end, having found nothing to take, and scans
    # again follow (without them, nothing would scan before the poll, a minute away).
    assert eventually(lambda: Delivery.select().where(Delivery.state == Delivery.DELIVERED).count() == 4)
    recorded_scans = len(scans)
    assert eventually(lambda: len(scans) >= recorded_scans + 2)
    clock.advance(LEASE / 1000)  # the other process's lease ends: both of `held`'s are due
    assert receiver.wait_for(2)
    assert [r.headers["X-VC-Event-Id"] for r in receiver.received] == queued[::-1]
