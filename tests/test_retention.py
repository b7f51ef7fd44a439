"""Retention (PARTNER_RETENTION_DAYS, `flask db prune`): exactly the old finished events go, with
their deliveries and failure records; open work stays. On SQLite and PostgreSQL."""

import pytest

from partner import retention
from models import Delivery, Event, Failure, db
from partner.outbox import claim_due
from tests.receivers import Receiver
from tests.support import WEBHOOKS, run_through_backoffs

DAY = 86400


pytestmark = pytest.mark.both_databases


@pytest.fixture
def config(config):
    # Two attempts an hour apart, so one failed event stays pending and the next is dead-lettered.
    config.update(WEBHOOK_ALLOWED_NETWORKS=["127.0.0.0/8"], DELIVERY_RETRY_DELAYS=[3600])
    return config


@pytest.fixture
def receivers():
    ok, failing = Receiver(script=[200]).start(), Receiver(script=[500]).start()
    yield ok, failing
    ok.stop()
    failing.stop()


@pytest.fixture
def history(app, client, auth, clock, receivers):
    """Events of every state, created 31 days ago ("old") and now ("new"); returns their ids."""
    dispatcher = app.extensions["delivery"]

    def pinger(receiver):
        response = client.post(WEBHOOKS, json={"url": receiver.url}, headers=auth).get_json()
        return lambda: client.post(f"{WEBHOOKS}/{response['id']}/test",
                                   json={"secret": response["secret"]}, headers=auth).get_json()["id"]

    ok, failing = (pinger(receiver) for receiver in receivers)
    now = clock.now
    ids = {"new_delivered": ok(), "new_dead": failing()}
    dispatcher.run_due()
    clock.advance(4000)  # past the retry delay and its jitter
    dispatcher.run_due()

    clock.now = now - 31 * DAY  # back in time: the old history, to subscriptions of its own (the new
    ok, failing = (pinger(receiver) for receiver in receivers)  # failures' backoffs end in its future)
    ids.update(old_delivered=ok(), old_dead=failing())
    dispatcher.run_due()
    clock.advance(4000)  # past the retry delay and its jitter
    ids["old_pending"] = failing()
    run_through_backoffs(dispatcher, clock)  # old_dead's second failure, old_pending's first after its backoff
    ids["old_in_flight"] = ok()
    with db.connection_context():
        assert [c.event_id for c in claim_due(int(clock() * 1000), 1, 60_000)] == [ids["old_in_flight"]]
    clock.now = now + 3 * 3600
    return ids


def remaining() -> dict:
    with db.connection_context():
        return {"events": {e.id for e in Event.select(Event.id)},
                "deliveries": {d.event_id: d.state for d in Delivery.select()},
                "failures": sorted(f.event_id for f in Failure.select(Failure.event))}


def test_prune_removes_exactly_the_old_finished_events_and_nothing_open(app, history):
    before = remaining()
    assert before["deliveries"][history["old_pending"]] == "pending"
    assert before["deliveries"][history["old_in_flight"]] == "in_flight"
    result = app.test_cli_runner().invoke(args=["db", "prune", "--older-than", "30"])
    assert result.exit_code == 0, result.output
    assert "Removed 2 events, 2 deliveries and 2 failure records" in result.output
    kept = {history[name] for name in ("old_pending", "old_in_flight", "new_delivered", "new_dead")}
    after = remaining()
    assert after["events"] == kept and set(after["deliveries"]) == kept
    assert after["failures"] == sorted(f for f in before["failures"] if f in kept)
    assert after["deliveries"] == {k: v for k, v in before["deliveries"].items() if k in kept}


def test_prune_defaults_to_the_retention_setting_and_goes_in_batches(app, history):
    with app.app_context(), db.connection_context():
        assert retention.prune(retention.cutoff(int(app.config["CLOCK"]() * 1000), 40)).events == 0
        pruned = retention.prune(retention.cutoff(int(app.config["CLOCK"]() * 1000), 30), batch=1)
    assert (pruned.events, pruned.deliveries, pruned.failures) == (2, 2, 2)
    result = app.test_cli_runner().invoke(args=["db", "prune"])
    assert result.exit_code == 0 and "Removed 0 events" in result.output and "(30 days)" in result.output


def test_the_daily_run_happens_once_a_day_whatever_the_number_of_processes(app, history, clock):
    config = app.config
    assert retention.run_daily(clock, config["RETENTION_DAYS"]).events == 2
    assert retention.run_daily(clock, config["RETENTION_DAYS"]) is None  # another worker, same day
    clock.advance(DAY - 60)
    assert retention.run_daily(clock, config["RETENTION_DAYS"]) is None
    clock.advance(60)
    assert retention.run_daily(clock, config["RETENTION_DAYS"]).events == 0


@pytest.mark.parametrize("days", ["0", "-1", "thirty", "36501", "999999999", "99999999999999999999"])
def test_prune_refuses_a_bad_age_cleanly(app, days):
    result = app.test_cli_runner().invoke(args=["db", "prune", "--older-than", days])
    assert result.exit_code == 2 and "--older-than" in result.output, result.output
    assert isinstance(result.exception, SystemExit)  # a usage error, not a traceback


def test_prune_takes_the_longest_age_it_allows(app, history):
    result = app.test_cli_runner().invoke(args=["db", "prune", "--older-than", "36500"])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("Removed 0 events")

