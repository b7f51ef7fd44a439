"""Fewer write transactions per delivery: the outcomes of attempts finishing together share one
transaction (group_commit.py), each caller still getting its own result or error."""

import time
from contextlib import contextmanager

import pytest

from models import Delivery
from partner.database import run_sql, select_rows, write_transaction
from partner.group_commit import GroupCommit
from partner.outbox import Outcome, claim_due, write_outcomes
from partner.outbound.transport import AttemptResult
from partner.retry import RetryPolicy
from tests.support import run_together
from tests.test_fair_claims import LEASE, NOW, enqueue_ping, subscriptions

POLICY = RetryPolicy([60], 20)
DELIVERED = AttemptResult(True, 200, None, "", 3)
SAVE = ("INSERT INTO setting (name, value) VALUES ({p}, 'saved') "
        "ON CONFLICT (name) DO UPDATE SET value = excluded.value")


class Counted:
    """A write transaction factory that keeps the size of each batch written in it."""

    def __init__(self, hold_first: float = 0.0):
        self.batches: list[int] = []
        self.hold_first = hold_first  # seconds the first batch keeps the writer: the others queue

    @contextmanager
    def __call__(self):
        with write_transaction(durable=False):
            yield
            if not self.batches and self.hold_first:
                time.sleep(self.hold_first)

    def write(self, write_items):
        def counted(items):
            self.batches.append(len(items))
            return write_items(items)
        return counted


@pytest.mark.both_databases
def test_outcomes_finishing_together_share_transactions_and_each_caller_gets_its_own(database, organization):
    for subscription in subscriptions(organization("acme"), 20):
        enqueue_ping(subscription)
    claims = claim_due(NOW, 64, LEASE)
    counted = Counted(hold_first=0.3)
    group = GroupCommit(counted, counted.write(lambda outcomes: write_outcomes(outcomes, POLICY)))
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


def test_an_item_that_fails_costs_the_others_in_its_batch_nothing(database):
    counted = Counted(hold_first=0.3)

    def save(names):
        for name in names:
            if name == "refused":
                raise ValueError("this one cannot be written")
            run_sql(SAVE, (name,))
        return names

    group = GroupCommit(counted, counted.write(save))
    outcomes = {}

    def write(name):
        try:
            outcomes[name] = group.run(name)
        except ValueError as error:
            outcomes[name] = error

    names = ["first", "a", "refused", "b", "c"]
    assert run_together(*[lambda name=name: write(name) for name in names]) == []
    assert isinstance(outcomes.pop("refused"), ValueError)
    assert outcomes == {name: name for name in names if name != "refused"}
    saved = {row["name"] for row in select_rows("SELECT name FROM setting WHERE value = 'saved'", ())}
    assert saved == {"first", "a", "b", "c"}
    assert max(counted.batches) > 1  # they were written together first, then one by one


def test_a_lone_outcome_is_written_at_once(database, organization):
    [subscription] = subscriptions(organization("acme"), 1)
    enqueue_ping(subscription)
    [claim] = claim_due(NOW, 64, LEASE)
    counted = Counted()
    group = GroupCommit(counted, counted.write(lambda outcomes: write_outcomes(outcomes, POLICY)))
    assert group.run(Outcome(claim, DELIVERED, NOW, NOW + 3)).recorded
    assert counted.batches == [1]
