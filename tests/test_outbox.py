"""The delivery queue (outbox.py) on the real database file: enqueue, claim, lease, record, cascade.

Nothing here makes an HTTP request: attempts are claimed and their outcomes recorded by hand.
"""

import json
import re
import uuid

import pytest

from partner.claims import pick_due
from partner.errors import ApiError
from partner.keys import create_key
from models import Delivery, Event, Failure, Subscription, db
from partner.events import enqueue_test_ping, failures_page, trigger_test_ping
from partner.outbox import claim_due
from partner.outcomes import NOT_RECORDED, Recorded
from partner.retry import RetryPolicy
from partner.retention import purge_deleted
from partner.subscriptions import create_subscription, delete_subscription, secret_of
from tests.support import body_of, delivery_of, history_of, query_plan, record_attempt, run_together
from partner.outbound.transport import AttemptResult

NOW = 1_800_000_000_123  # 2027-01-15T08:00:00.123Z, Unix ms
LEASE = 40_000
THRESHOLD = 20
POLICY = RetryPolicy([60, 300, 1800, 7200, 21600, 86400], THRESHOLD)
LAST = RetryPolicy([], THRESHOLD)  # every attempt is the last one
URL = "http://93.184.215.14/hook"  # never contacted: nothing here sends


@pytest.fixture
def org(database):
    return create_key("acme", ["webhooks:manage"], NOW).key.organization


@pytest.fixture
def subscription(org):
    return create_subscription(org.id, URL, None, NOW)


@pytest.fixture
def other_subscription(org):
    return create_subscription(org.id, "http://93.184.215.14/other", None, NOW)


def reload(row):
    return type(row).get_by_id(row.get_id())


def delivery(event_id: str) -> Delivery:
    return delivery_of(event_id)


def enqueue_ping(subscription, at: int = NOW) -> Event:
    return enqueue_test_ping(subscription, "KEYID", at)


def failed(http_status: int | None = 500, error: str = "http_status", excerpt: str = "oops",
           duration_ms: int = 41) -> AttemptResult:
    return AttemptResult(False, http_status, error, excerpt, duration_ms)


def fail(claim, result: AttemptResult | None = None, at: int = NOW, policy: RetryPolicy = POLICY) -> Recorded:
    """Record a failed attempt made at `at` (finished `duration_ms` later), without jitter."""
    result = result or failed()
    return record_attempt(claim, result, at, at + result.duration_ms, policy, jitter=0)


def succeed(claim, at: int = NOW) -> Recorded:
    return record_attempt(claim, AttemptResult(True, 200, None, "", 12), at, at + 12, POLICY, jitter=0)


def claim_one(now: int = NOW):
    [claim] = claim_due(now, 1, LEASE)
    return claim


def fail_streak(subscription, failures: int) -> None:
    Subscription.update(consecutive_failures=failures).where(Subscription.id == subscription.id).execute()


# --- enqueue ----------------------------------------------------------------------------------

def test_a_ping_is_one_event_and_one_pending_delivery_due_now(subscription):
    event = enqueue_ping(subscription)
    assert [(e.id, e.kind, e.created_at, e.occurred_at, e.body) for e in Event.select()] == \
        [(event.id, "vc.test.ping", NOW, NOW, None)]
    assert [(d.event_id, d.subscription_id, d.state, d.attempts, d.due_at, d.lease_token) for d in Delivery.select()] == \
        [(event.id, subscription.id, "pending", 0, NOW, None)]


def test_the_body_is_the_compact_envelope(subscription):
    body = body_of(enqueue_ping(subscription), subscription.id)
    envelope = json.loads(body)
    assert body == json.dumps(envelope, separators=(",", ":"), ensure_ascii=False).encode()
    assert list(envelope) == ["event", "id", "subscription_id", "occurred_at", "data"]
    assert envelope["event"] == "vc.test.ping"
    assert envelope["subscription_id"] == subscription.id
    assert envelope["data"]["triggered_by_key_id"] == "KEYID"
    assert isinstance(envelope["data"]["message"], str) and envelope["data"]["message"]


def test_the_event_id_is_evt_and_a_uuid4(subscription):
    event = enqueue_ping(subscription)
    assert event.id.startswith("evt_")
    assert str(uuid.UUID(event.id.removeprefix("evt_"), version=4)) == event.id.removeprefix("evt_")
    assert json.loads(body_of(event, subscription.id))["id"] == event.id


@pytest.mark.parametrize("now, occurred_at", [
    (NOW, "2027-01-15T08:00:00.123Z"),
    (1_800_000_000_000, "2027-01-15T08:00:00.000Z"),
    (1_800_000_000_009, "2027-01-15T08:00:00.009Z"),
    (1_800_000_059_999, "2027-01-15T08:00:59.999Z"),
])
def test_occurred_at_is_the_given_time_in_rfc3339_milliseconds(subscription, now, occurred_at):
    assert json.loads(body_of(enqueue_ping(subscription, now), subscription.id))["occurred_at"] == occurred_at


def test_every_ping_is_a_new_event(subscription):
    ids = {enqueue_ping(subscription).id for _ in range(5)}
    assert len(ids) == 5
    assert Delivery.select().count() == 5


# --- claim ------------------------------------------------------------------------------------

def test_nothing_is_claimed_before_it_is_due(subscription):
    enqueue_ping(subscription, NOW + 5000)
    assert claim_due(NOW + 4999, 10, LEASE) == []
    assert delivery(Event.get().id).state == "pending"


def test_a_due_delivery_is_claimed_with_all_it_needs(subscription):
    event = enqueue_ping(subscription)
    [claim] = claim_due(NOW, 10, LEASE)
    assert (claim.event_id, claim.kind, claim.body, claim.attempt, claim.subscription_id, claim.url,
            claim.secret) == (event.id, "vc.test.ping", body_of(event, subscription.id), 1, subscription.id, URL,
                              secret_of(subscription))
    row = delivery(event.id)
    assert (row.state, row.due_at, row.lease_token, row.attempts) == \
        ("in_flight", NOW + LEASE, claim.lease_token, 0)


def test_a_late_claim_still_takes_an_overdue_delivery(subscription):
    event = enqueue_ping(subscription)
    assert [c.event_id for c in claim_due(NOW + 86_400_000, 10, LEASE)] == [event.id]


def test_a_claimed_delivery_is_not_claimed_again_while_leased(subscription):
    enqueue_ping(subscription)
    claim_one()
    assert claim_due(NOW, 10, LEASE) == []
    assert claim_due(NOW + LEASE - 1, 10, LEASE) == []


def test_an_expired_lease_is_claimed_again_with_the_same_event_and_attempt(subscription):
    event = enqueue_ping(subscription)
    crashed = claim_one()
    [retaken] = claim_due(NOW + LEASE, 10, LEASE)
    assert (retaken.event_id, retaken.attempt, retaken.body) == (event.id, 1, crashed.body)
    assert retaken.lease_token != crashed.lease_token
    assert delivery(event.id).due_at == NOW + 2 * LEASE


def subscriptions_of(subscription, count: int) -> list:
    """`subscription` and count - 1 more of its organization: each may have one delivery in flight."""
    return [subscription] + [create_subscription(subscription.organization_id, f"http://93.184.215.14/{n}",
                                                 None, NOW) for n in range(count - 1)]


def test_claims_take_the_earliest_due_first(subscription):
    first, second, third = subscriptions_of(subscription, 3)
    late, early, middle = enqueue_ping(first, NOW + 2), enqueue_ping(second, NOW), enqueue_ping(third, NOW + 1)
    assert [claim_one(NOW + 10).event_id for _ in range(3)] == [early.id, middle.id, late.id]


def test_claims_are_limited_to_the_earliest_due(subscription):
    events = [enqueue_ping(each, NOW + offset)
              for each, offset in zip(subscriptions_of(subscription, 5), (5, 3, 1, 4, 2))]
    claimed = {claim.event_id for claim in claim_due(NOW + 10, 2, LEASE)}
    assert claimed == {events[2].id, events[4].id}
    assert Delivery.select().where(Delivery.state == "pending").count() == 3


def test_a_subscription_has_at_most_one_delivery_in_flight(subscription):
    oldest, newer = enqueue_ping(subscription, NOW), enqueue_ping(subscription, NOW + 1)
    assert [claim.event_id for claim in claim_due(NOW + 10, 10, LEASE)] == [oldest.id]
    assert claim_due(NOW + 10, 10, LEASE) == []
    assert delivery(newer.id).state == "pending"


def test_the_next_delivery_of_a_subscription_is_claimed_once_the_first_finishes(subscription):
    _, newer = enqueue_ping(subscription, NOW), enqueue_ping(subscription, NOW + 1)
    succeed(claim_one(NOW + 10))
    assert claim_one(NOW + 10).event_id == newer.id


def test_an_expired_lease_frees_the_subscription(subscription):
    _, newer = enqueue_ping(subscription, NOW), enqueue_ping(subscription, NOW + 1)  # the first one crashes
    claim_one(NOW + 10)  # its attempt's process dies; its lease runs to NOW + 10 + LEASE
    later = NOW + 10 + LEASE + 1
    assert claim_one(later).event_id == newer.id  # due earlier than the lease expiry
    assert claim_due(later, 10, LEASE) == []  # one in flight at a time, again


def test_a_claim_says_whether_the_subscriptions_last_attempt_failed(subscription, other_subscription):
    fail_streak(subscription, 1)
    enqueue_ping(subscription), enqueue_ping(other_subscription)
    assert {claim.subscription_id: claim.failing for claim in claim_due(NOW, 10, LEASE)} == {
        subscription.id: True, other_subscription.id: False}


def test_failing_subscriptions_get_at_most_their_limit_and_healthy_ones_the_rest(subscription):
    failing_ones, healthy_ones = subscriptions_of(subscription, 3), subscriptions_of(subscription, 3)[1:]
    for each in failing_ones:
        fail_streak(each, 2)
        enqueue_ping(each, NOW)  # due before every healthy one
    for each in healthy_ones:
        enqueue_ping(each, NOW + 1)
    claims = claim_due(NOW + 10, 4, LEASE, failing_limit=1)
    assert sorted(claim.failing for claim in claims) == [False, False, True]
    assert Delivery.select().where(Delivery.state == "pending").count() == 2  # the other failing ones


def test_no_failing_subscription_is_claimed_when_their_limit_is_spent(subscription, other_subscription):
    fail_streak(subscription, 1)
    enqueue_ping(subscription, NOW), enqueue_ping(other_subscription, NOW + 1)
    assert [claim.subscription_id for claim in claim_due(NOW + 10, 10, LEASE, failing_limit=0)] == [
        other_subscription.id]
    assert claim_one(NOW + 10).subscription_id == subscription.id  # without a limit, it goes


@pytest.mark.parametrize("limit", [0, -1])
def test_a_limit_below_one_claims_nothing(subscription, limit):
    enqueue_ping(subscription)
    assert claim_due(NOW, limit, LEASE) == []
    assert delivery(Event.get().id).state == "pending"


def test_finished_deliveries_are_never_claimed(subscription):
    delivered, dead = enqueue_ping(subscription), enqueue_ping(subscription)
    succeed(claim_due(NOW, 1, LEASE)[0])
    fail(claim_one(), policy=LAST)
    assert {delivery(delivered.id).state, delivery(dead.id).state} == {"delivered", "dead"}
    assert claim_due(NOW + 365 * 86_400_000, 10, LEASE) == []


# --- success ----------------------------------------------------------------------------------

def test_success_marks_the_delivery_delivered(subscription):
    event = enqueue_ping(subscription)
    assert succeed(claim_one()).recorded
    row = delivery(event.id)
    assert (row.state, row.attempts, row.due_at, row.lease_token) == ("delivered", 1, None, None)
    assert Failure.select().count() == 0


def test_success_resets_consecutive_failures(subscription):
    enqueue_ping(subscription)
    fail_streak(subscription, 7)
    succeed(claim_one())
    assert reload(subscription).consecutive_failures == 0


# --- failure ----------------------------------------------------------------------------------

def test_a_failure_is_audited_with_its_fields(subscription):
    event = enqueue_ping(subscription)
    claim = claim_one()
    result = AttemptResult(False, 503, "http_status", "busy", 1234)
    assert fail(claim, result, at=NOW + 10) == Recorded(True, NOW + 61_244)
    [failure] = Failure.select()
    assert failure.id.startswith("fail_")
    assert (failure.subscription_id, failure.event_id, failure.attempt, failure.http_status, failure.error,
            failure.response_excerpt, failure.duration_ms, failure.attempted_at, failure.next_attempt_at) == \
        (subscription.id, event.id, 1, 503, "http_status", "busy", 1234, NOW + 10, NOW + 61_244)


def test_a_failure_without_a_response_has_no_http_status(subscription):
    enqueue_ping(subscription)
    fail(claim_one(), failed(http_status=None, error="timeout", excerpt=""))
    assert (Failure.get().http_status, Failure.get().error) == (None, "timeout")


def test_a_failure_counts_against_the_subscription(subscription):
    enqueue_ping(subscription)
    fail(claim_one())
    assert reload(subscription).consecutive_failures == 1


def test_a_failure_with_a_next_attempt_waits_for_it(subscription):
    event = enqueue_ping(subscription)
    fail(claim_one())
    row = delivery(event.id)
    assert (row.state, row.attempts, row.due_at, row.lease_token) == ("pending", 1, NOW + 60_041, None)
    assert claim_due(NOW + 60_040, 10, LEASE) == []
    [claim] = claim_due(NOW + 60_041, 10, LEASE)
    assert (claim.event_id, claim.attempt) == (event.id, 2)


def test_a_failure_without_a_next_attempt_is_dead_lettered(subscription):
    event = enqueue_ping(subscription)
    assert fail(claim_one(), policy=LAST) == Recorded(True, None, dead_lettered=True)
    row = delivery(event.id)
    assert (row.state, row.attempts, row.due_at, row.lease_token) == ("dead", 1, None, None)
    assert Failure.get().next_attempt_at is None
    assert reload(subscription).active is True


def test_attempt_numbers_follow_the_recorded_attempts(subscription):
    enqueue_ping(subscription)
    now = NOW
    for attempt in range(1, 4):
        claim = claim_one(now)
        assert claim.attempt == attempt
        fail(claim, at=now, policy=RetryPolicy([1] * 6, THRESHOLD))
        now += 5000  # past the retry delay, and past the backoff the failure holds the subscription for
    assert [f.attempt for f in Failure.select().order_by(Failure.attempt)] == [1, 2, 3]


def test_one_short_of_the_threshold_stays_active(subscription):
    enqueue_ping(subscription)
    fail_streak(subscription, THRESHOLD - 2)
    fail(claim_one())
    state = reload(subscription)
    assert (state.active, state.consecutive_failures, state.auto_disabled_at) == (True, THRESHOLD - 1, None)


def test_reaching_the_threshold_auto_disables_at_the_finish_time(subscription):
    event = enqueue_ping(subscription)
    fail_streak(subscription, THRESHOLD - 1)
    assert fail(claim_one(), at=NOW + 5) == Recorded(True, None, dead_lettered=True, auto_disabled=True)
    state = reload(subscription)
    assert (state.active, state.consecutive_failures, state.auto_disabled_at) == \
        (False, THRESHOLD, NOW + 5 + 41)
    assert (delivery(event.id).state, delivery(event.id).due_at) == ("dead", None)
    assert Failure.get().next_attempt_at is None


def test_auto_disable_dead_letters_the_other_pending_deliveries(subscription, other_subscription):
    failing = enqueue_ping(subscription)
    waiting = [enqueue_ping(subscription, NOW + offset) for offset in (1, 60_000, 86_400_000)]
    elsewhere = enqueue_ping(other_subscription, NOW + 1)
    fail_streak(subscription, THRESHOLD - 1)
    fail(claim_one())
    assert [(delivery(e.id).state, delivery(e.id).due_at) for e in [failing, *waiting]] == [("dead", None)] * 4
    assert delivery(elsewhere.id).state == "pending"
    assert [c.event_id for c in claim_due(NOW + 365 * 86_400_000, 10, LEASE)] == [elsewhere.id]


def test_a_failure_finishing_after_the_auto_disable_is_dead_lettered(subscription):
    enqueue_ping(subscription)
    fail_streak(subscription, THRESHOLD - 1)
    stale = claim_one(NOW + 1)  # stuck past its lease, then taken over
    disabling = claim_one(NOW + 1 + LEASE + 1)
    fail(disabling, at=NOW + LEASE + 10)
    assert fail(stale, at=NOW + LEASE + 20) == NOT_RECORDED
    assert (delivery(disabling.event_id).state, delivery(disabling.event_id).due_at) == ("dead", None)
    state = reload(subscription)
    assert (state.active, state.auto_disabled_at) == (False, NOW + LEASE + 10 + 41)


def test_a_failure_on_a_disabled_subscription_is_dead_lettered(subscription):
    event = enqueue_ping(subscription)
    claim = claim_one()
    Subscription.update(active=False, auto_disabled_at=NOW - 1).where(Subscription.id == subscription.id).execute()
    assert fail(claim) == Recorded(True, None, dead_lettered=True)
    assert delivery(event.id).state == "dead"
    assert reload(subscription).auto_disabled_at == NOW - 1  # the first disable time is kept


def test_a_crashed_attempt_is_not_resent_after_the_subscription_is_auto_disabled(subscription):
    enqueue_ping(subscription)
    crashed = enqueue_ping(subscription, NOW + 1)
    (Delivery.update(state=Delivery.IN_FLIGHT, due_at=NOW - 1, lease_token="died-long-ago")
     .where(Delivery.event == crashed.id).execute())
    fail_streak(subscription, THRESHOLD - 1)
    disabling = claim_one(NOW + 1)
    fail(disabling, at=NOW + 10)
    assert delivery(crashed.id).state == "dead"
    assert claim_due(NOW + LEASE + 1000, 10, LEASE) == []


@pytest.mark.both_databases
def test_a_ping_racing_an_auto_disable_is_never_sent(app, subscription):
    """Pings and the failures that disable the subscription commit in any order: afterwards nothing
    for it is left to claim, and every ping either was refused (409) or was dead-lettered."""
    org = subscription.organization
    fail_streak(subscription, THRESHOLD - 1)
    enqueue_ping(subscription)
    failing = claim_one()
    outcomes = []

    def trigger_pings():
        with app.app_context(), db.connection_context():
            for _ in range(20):
                try:
                    trigger_test_ping(org.id, subscription.id, secret_of(subscription), "KEYID", NOW + 1)
                    outcomes.append("queued")
                except ApiError as error:
                    outcomes.append(error.code)

    def disable():
        with app.app_context(), db.connection_context():
            fail(failing, at=NOW + 1)

    assert run_together(trigger_pings, disable) == []
    assert reload(subscription).active is False
    assert set(outcomes) <= {"queued", "subscription_disabled"} and len(outcomes) == 20
    assert claim_due(NOW + 365 * 86_400_000, 100, LEASE) == []
    assert {d.state for d in Delivery.select()} == {"dead"}


def test_a_delivery_left_for_a_disabled_subscription_is_dead_lettered_not_claimed(subscription):
    event = enqueue_ping(subscription)
    Subscription.update(active=False, auto_disabled_at=NOW).where(Subscription.id == subscription.id).execute()
    assert claim_due(NOW + 10, 10, LEASE) == []
    assert (delivery(event.id).state, delivery(event.id).lease_token) == ("dead", None)


# --- lost leases --------------------------------------------------------------------------------

def test_a_stale_failure_records_nothing(subscription):
    event = enqueue_ping(subscription)
    stale = claim_one()
    current = claim_one(NOW + LEASE)
    assert fail(stale) == NOT_RECORDED
    assert Failure.select().count() == 0
    assert reload(subscription).consecutive_failures == 0
    row = delivery(event.id)
    assert (row.state, row.lease_token, row.attempts) == ("in_flight", current.lease_token, 0)


def test_a_stale_failure_at_the_threshold_does_not_disable(subscription):
    enqueue_ping(subscription)
    fail_streak(subscription, THRESHOLD - 1)
    stale = claim_one()
    claim_one(NOW + LEASE)
    fail(stale)
    assert (reload(subscription).active, reload(subscription).consecutive_failures) == (True, THRESHOLD - 1)


def test_a_stale_success_records_nothing(subscription):
    event = enqueue_ping(subscription)
    stale = claim_one()
    current = claim_one(NOW + LEASE)
    fail_streak(subscription, 3)
    assert not succeed(stale).recorded
    assert reload(subscription).consecutive_failures == 3
    assert (delivery(event.id).state, delivery(event.id).lease_token) == ("in_flight", current.lease_token)


def test_the_current_claim_still_finishes_after_a_stale_one_tried(subscription):
    event = enqueue_ping(subscription)
    stale = claim_one()
    current = claim_one(NOW + LEASE)
    fail(stale)
    assert succeed(current).recorded
    assert delivery(event.id).state == "delivered"


def test_a_finish_after_the_subscription_was_deleted_records_nothing(subscription):
    enqueue_ping(subscription)
    claim = claim_one()
    delete_subscription(subscription, NOW)
    assert fail(claim) == NOT_RECORDED
    assert not succeed(claim).recorded
    assert Failure.select().count() == 0


# --- delete -------------------------------------------------------------------------------------

def test_deleting_a_subscription_deletes_its_events_deliveries_and_failures(subscription, other_subscription):
    for target, first_due in ((subscription, NOW), (other_subscription, NOW + 10)):
        for offset in range(3):
            enqueue_ping(target, first_due + offset)
    at = NOW + 20
    for _ in range(2):  # per subscription, in due order: one retry pending, one dead, one in flight
        fail(claim_one(at), at=at)
        fail(claim_one(at + 5000), at=at + 5000, policy=LAST)  # each after the last failure's backoff
        claim_one(at + 10_000)
        at += 15_000
    assert history_of(subscription) == [3, 3, 2]
    assert sorted(d.state for d in Delivery.select()) == ["dead", "dead", "in_flight", "in_flight",
                                                          "pending", "pending"]
    delete_subscription(subscription, NOW + 30)
    assert purge_deleted() == 1
    assert Subscription.get_or_none(Subscription.id == subscription.id) is None
    assert history_of(subscription) == [0, 0, 0]
    assert history_of(other_subscription) == [3, 3, 2]
    assert Event.select().count() == 3  # the deleted one's, delivered to no one else, went with it
    assert [Event.select().count(), Delivery.select().count(), Failure.select().count()] == [3, 3, 2]


# --- query plans ----------------------------------------------------------------------------------

@pytest.mark.parametrize("failing_limit", [None, 0, 1])
def test_the_claim_walks_the_queue_index_not_the_deliveries(database, subscription, failing_limit):
    for offset in range(3):
        enqueue_ping(subscription, NOW + offset)
    plan = query_plan(database, lambda: claim_due(NOW + 10, 2, LEASE, failing_limit))
    assert "SEARCH delivery USING INDEX delivery_queue (subscription_id>?)" in plan  # the walk
    assert "SEARCH delivery USING INDEX delivery_queue (subscription_id=? AND due_at<?)" in plan  # a head
    # Only candidates (one per subscription) are sorted; no delivery row is read outside an index.
    assert not [line for line in plan.splitlines() if line.startswith("SCAN") and "INDEX" not in line
                and "delivery" in line]


def test_choosing_what_to_claim_searches_no_index_that_history_grows(database, subscription):
    """Finished deliveries stay in the delivery table, its primary key and the (subscription, state)
    index; the choice reads only the partial indexes of open deliveries and subscriptions by id, so
    a million finished ones cost it nothing (bench/state_scale)."""
    for offset in range(3):
        enqueue_ping(subscription, NOW + offset)
    plan = query_plan(database, lambda: pick_due(NOW + 10, 2, 1, 16))
    assert set(re.findall(r"USING (?:COVERING )?INDEX (\w+)", plan)) == {
        "delivery_queue", "delivery_in_flight", "sqlite_autoindex_subscription_1"}
    # Each subscription's room is found once (inlined, its subqueries would run again at every use).
    assert "MATERIALIZE rooms" in plan and "MATERIALIZE busy" in plan


@pytest.mark.parametrize("position", [None, [NOW + 5, "fail_zzzzzzzzzzzzzzzzzzzz"]], ids=["first", "next"])
def test_the_failures_page_uses_its_keyset_index(database, subscription, position):
    enqueue_ping(subscription)
    fail(claim_one())
    plan = query_plan(database, lambda: failures_page(subscription, position, 20))
    assert "failure_subscription_id_attempted_at_id" in plan
    assert "TEMP B-TREE" not in plan  # ordered by the index, not sorted afterwards
