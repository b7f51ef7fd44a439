"""Fewer writes per delivery: the outcomes of attempts finishing together are written at once
(group_commit.py), each caller still getting its own result or error."""

import threading

import pytest
from peewee import IntegrityError

from models import Delivery, Subscription
from partner.store.sql import run_sql, select_rows, write_transaction
from partner.store.group_commit import GroupCommit
from partner.outbox import claim_due
from partner.outcomes import Outcome, write_outcomes
from partner.outbound.transport import AttemptResult
from partner.retry import RetryPolicy
from tests.support import allow_in_sqlite, delivery_of, eventually, refuse_in_sqlite, run_together
from tests.test_fair_claims import LEASE, NOW, claimed_ping, enqueue_ping, expired_and_next, subscriptions

POLICY = RetryPolicy([60], 20)
DELIVERED = AttemptResult(True, 200, None, "", 3)
FAILED = AttemptResult(False, 500, "http_status", "", 3)
SAVE = ("INSERT INTO setting (name, value) VALUES (:name, 'saved') "
        "ON CONFLICT (name) DO UPDATE SET value = excluded.value")


class Counted:
    """A batch writer that keeps the size of each batch it writes. Given `items` (how many the test
    runs), the first batch keeps the writer until all the others are queued behind it."""

    def __init__(self, write_items, items: int = 0):
        self.write_items, self.items = write_items, items
        self.batches: list[int] = []
        self.group: GroupCommit | None = None

    def __call__(self, items):
        self.batches.append(len(items))
        results = self.write_items(items)
        if len(self.batches) == 1 and self.items:
            assert eventually(lambda: self.batches[0] + len(self.group._queue) == self.items)
        return results

    def grouped(self) -> GroupCommit:
        self.group = GroupCommit(self)
        return self.group


def recorded_by(policy):
    return lambda outcomes: write_outcomes(outcomes, policy)


@pytest.mark.both_databases
def test_outcomes_finishing_together_are_written_together_and_each_caller_gets_its_own(database, organization):
    for subscription in subscriptions(organization("acme"), 20):
        enqueue_ping(subscription)
    claims = claim_due(NOW, 64, LEASE)
    counted = Counted(recorded_by(POLICY), items=len(claims))
    group = counted.grouped()
    recorded = {}

    def finish(claim):
        recorded[claim.event_id] = group.run(Outcome(claim, DELIVERED, NOW, NOW + 3))

    assert run_together(*[lambda claim=claim: finish(claim) for claim in claims]) == []
    assert sorted(recorded) == sorted(claim.event_id for claim in claims)
    assert all(r.recorded for r in recorded.values())
    assert sum(counted.batches) == 20
    assert max(counted.batches) > 1 and len(counted.batches) < 20
    assert {d.state for d in Delivery.select()} == {"delivered"}
    assert {d.attempts for d in Delivery.select()} == {1}


def test_each_caller_gets_its_own_outcome_from_a_mixed_batch(database, organization):
    for subscription in subscriptions(organization("acme"), 6):
        enqueue_ping(subscription)
    claims = claim_due(NOW, 64, LEASE)
    failed = {claims[1].event_id, claims[4].event_id}
    group = Counted(recorded_by(POLICY), items=len(claims)).grouped()
    recorded = {}

    def finish(claim):
        result = FAILED if claim.event_id in failed else DELIVERED
        recorded[claim.event_id] = group.run(Outcome(claim, result, NOW, NOW + 3))

    assert run_together(*[lambda claim=claim: finish(claim) for claim in claims]) == []
    assert {event_id for event_id, r in recorded.items() if r.next_attempt_at} == failed
    assert all(r.recorded for r in recorded.values())
    assert {d.event_id: d.state for d in Delivery.select()} == {
        claim.event_id: "pending" if claim.event_id in failed else "delivered" for claim in claims}


def test_a_batch_cut_short_leaves_no_caller_waiting_or_without_an_answer(database):
    def write(names):
        if "cut" in names:
            raise KeyboardInterrupt  # not an Exception: it ends the writing thread's batch
        return names

    counted = Counted(write, items=4)
    group = counted.grouped()
    answers = {}

    def run(name):
        try:
            answers[name] = group.run(name)
        except BaseException as error:  # noqa: BLE001 - the answer under test
            answers[name] = type(error).__name__

    names = ["first", "a", "cut", "b"]
    threads = [threading.Thread(target=run, args=(name,)) for name in names]
    for thread in threads:
        thread.start()
        assert eventually(lambda: counted.batches)  # "first" writes alone, the others queue
    for thread in threads:
        thread.join(timeout=10)
    assert not any(thread.is_alive() for thread in threads)
    assert answers["first"] == "first"
    later = {answers[name] for name in ("a", "cut", "b")}
    assert None not in later and later <= {"KeyboardInterrupt", "RuntimeError"}


def test_an_item_that_fails_costs_the_others_in_its_batch_nothing(database):
    def save(names):
        with write_transaction(durable=False):
            for name in names:
                if name == "refused":
                    raise ValueError("this one cannot be written")
                run_sql(SAVE, {"name": name})
        return names

    names = ["first", "a", "refused", "b", "c"]
    counted = Counted(save, items=len(names))
    group = counted.grouped()
    outcomes = {}

    def write(name):
        try:
            outcomes[name] = group.run(name)
        except ValueError as error:
            outcomes[name] = error

    assert run_together(*[lambda name=name: write(name) for name in names]) == []
    assert isinstance(outcomes.pop("refused"), ValueError)
    assert outcomes == {name: name for name in names if name != "refused"}
    saved = {row["name"] for row in select_rows("SELECT name FROM setting WHERE value = 'saved'", {})}
    assert saved == {"first", "a", "b", "c"}
    assert max(counted.batches) > 1  # they were written together first, then one by one


def test_a_lone_outcome_is_written_at_once(database, organization):
    _, claim = claimed_ping(organization("acme"))
    counted = Counted(recorded_by(POLICY))
    group = GroupCommit(counted)
    assert group.run(Outcome(claim, DELIVERED, NOW, NOW + 3)).recorded
    assert counted.batches == [1]


@pytest.mark.both_databases
def test_a_success_resets_a_streak_counted_after_its_claim(database, organization):
    [subscription] = subscriptions(organization("acme"), 1)
    late, claim = expired_and_next(subscription)
    assert not claim.failing
    write_outcomes([Outcome(late, FAILED, NOW, NOW + LEASE + 2)], POLICY)  # its lease not taken yet: counted
    assert [r.recorded for r in write_outcomes([Outcome(claim, DELIVERED, NOW, NOW + LEASE + 3)], POLICY)] == [True]
    assert Subscription.get_by_id(subscription.id).consecutive_failures == 0


def test_a_success_and_its_streak_reset_commit_together_or_not_at_all(database, organization):
    subscription, claim = claimed_ping(organization("acme"))
    Subscription.update(consecutive_failures=3).where(Subscription.id == subscription.id).execute()
    refuse_in_sqlite("UPDATE OF consecutive_failures ON subscription")
    with pytest.raises(IntegrityError):
        write_outcomes([Outcome(claim, DELIVERED, NOW, NOW + 3)], POLICY)
    assert delivery_of(claim.event_id).lease_token == claim.lease_token  # not delivered: written again
    allow_in_sqlite()
    assert [r.recorded for r in write_outcomes([Outcome(claim, DELIVERED, NOW, NOW + 4)], POLICY)] == [True]
    assert Subscription.get_by_id(subscription.id).consecutive_failures == 0


def test_the_writer_tells_of_each_item_committed_before_its_caller_runs_again(database):
    """The dispatcher frees an attempt's slot as its outcome commits (delivery.py): told by the thread
    that wrote the batch, before the caller returns; an item whose write failed is not told of."""
    committed, seen_by_callers = [], {}

    def write(names):
        if "refused" in names:
            raise ValueError("refused")
        return names

    group = GroupCommit(write, committed.append)

    def run(name):
        try:
            group.run(name)
        except ValueError:
            pass
        seen_by_callers[name] = name in committed

    assert run_together(*[lambda name=name: run(name) for name in ("a", "b", "refused", "c")]) == []
    assert sorted(committed) == ["a", "b", "c"]
    assert seen_by_callers == {"a": True, "b": True, "refused": False, "c": True}


def test_a_hook_that_fails_after_the_commit_costs_no_caller_its_result(database):
    def fail(item):
        raise RuntimeError("the hook failed")

    group = GroupCommit(lambda names: [name.upper() for name in names], fail)
    results = {}
    assert run_together(*[lambda name=name: results.update({name: group.run(name)}) for name in "abc"]) == []
    assert results == {"a": "A", "b": "B", "c": "C"}
