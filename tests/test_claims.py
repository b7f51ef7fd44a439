"""Several processes may scan the same database, and a due delivery is claimed by
exactly one of them. Real OS processes and threads with their own connections, on SQLite and on
PostgreSQL, race to claim the same due deliveries."""

import multiprocessing

import pytest

from models import Organization, Subscription, db
from tests.support import open_database
from partner.outbox import claim_due
from tests.support import queue_in_bulk, run_together

NOW = 1_800_000_000_000
LEASE = 40_000
DUE = 500
BATCH = 7  # small batches: many rounds in which the claimers overlap


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/partner.sqlite3"
    return request.getfixturevalue("postgres_url")


@pytest.fixture
def due(database_url) -> set[str]:
    """DUE deliveries, all due now; returns their event ids."""
    database = open_database(database_url)
    with db.connection_context():
        org = Organization.create(id="org_1", slug="acme", created_at=NOW)
        ids = [f"evt_{n:04d}" for n in range(DUE)]
        queue_in_bulk(org, ids, NOW, NOW)  # one subscription each: at most one delivery in flight each
    yield set(ids)
    database.close()


def claim_until_empty(now_ms: int = NOW) -> list[str]:
    """Claim in batches on this thread's own connection until nothing is due."""
    claimed = []
    while True:
        with db.connection_context():
            batch = claim_due(now_ms, BATCH, LEASE)
        if not batch:
            return claimed
        claimed += [claim.event_id for claim in batch]


def scan_in_a_process(database_url: str, start, results) -> None:
    """A separate scanner process: its own app, its own connection, the same database."""
    from tests.support import started_app
    try:
        started_app({"DATABASE_URL": database_url, "SCHEDULER_ENABLED": False})
        start.wait(timeout=60)
        results.put(claim_until_empty())
    except BaseException as error:
        results.put(repr(error))  # for the test's report, rather than a silent timeout
        raise


def assert_claimed_exactly_once(per_claimer: list[list[str]], due: set[str]) -> None:
    every = [event_id for claimed in per_claimer for event_id in claimed]
    assert len(every) == len(set(every)), "a delivery was claimed twice"
    assert set(every) == due, "a due delivery was never claimed"


@pytest.mark.servers  # two scanner processes
def test_two_processes_claim_every_due_delivery_exactly_once(database_url, due):
    context = multiprocessing.get_context("spawn")  # a fresh interpreter: nothing inherited
    start, results = context.Barrier(2), context.Queue()
    processes = [context.Process(target=scan_in_a_process, args=(database_url, start, results))
                 for _ in range(2)]
    for process in processes:
        process.start()
    per_process = [results.get(timeout=120) for _ in processes]
    for process in processes:
        process.join(timeout=30)
    assert all(isinstance(claimed, list) for claimed in per_process), per_process
    assert [process.exitcode for process in processes] == [0, 0]
    assert_claimed_exactly_once(per_process, due)


def test_four_threads_claim_every_due_delivery_exactly_once(due):
    per_thread = []
    assert run_together(*[lambda: per_thread.append(claim_until_empty())] * 4) == []
    assert len(per_thread) == 4
    assert_claimed_exactly_once(per_thread, due)


def test_a_claim_that_excludes_failing_subscriptions_takes_every_other_due_delivery(due):
    failing = set(sorted(due)[:10])
    with db.connection_context():
        (Subscription.update(consecutive_failures=1)
         .where(Subscription.id.in_([f"wh_{i}" for i in failing])).execute())
        claimed = claim_due(NOW, DUE, LEASE, failing_limit=0)
        capped = claim_due(NOW, DUE, LEASE, failing_limit=3)
    assert {claim.event_id for claim in claimed} == due - failing
    assert [claim.failing for claim in capped] == [True] * 3
