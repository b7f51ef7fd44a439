"""`flask webhooks list|enable` and `flask deliveries list|replay` (docs/operations.md), through the real
app and CLI, with real receivers on 127.0.0.1 and the queue stepped with run_due()."""

import pytest

from models import Subscription, db
from tests.support import WEBHOOKS, json_of



# On both databases; one attempt per event, and the second failure in a row auto-disables.
pytestmark = [pytest.mark.both_databases,
              pytest.mark.config(WEBHOOK_ALLOWED_NETWORKS=["127.0.0.0/8"], DELIVERY_RETRY_DELAYS=[],
                                 AUTO_DISABLE_THRESHOLD=2)]




@pytest.fixture
def flask_cli(app):
    runner = app.test_cli_runner()
    return lambda *args: runner.invoke(args=list(args))


@pytest.fixture
def recovering_receiver(start_receiver):
    """Fails twice (500), then answers 200."""
    return start_receiver(script=[500, 500, 200])


@pytest.fixture
def run_due(app):
    return app.extensions["delivery"].run_due


@pytest.fixture
def disabled(subscribe, ping, run_due, recovering_receiver):
    """A subscription auto-disabled by two failed events, now dead letters; its recovering_receiver now says 200."""
    subscription = subscribe(recovering_receiver.url)
    subscription["events"] = [queued_event(ping, subscription), queued_event(ping, subscription)]
    assert run_due() == 2
    return subscription


def rows(result) -> list[list[str]]:
    assert result.exit_code == 0, result.output
    return [line.split("\t") for line in result.stdout.splitlines()]


def test_webhooks_list_shows_state_and_counts_never_a_secret(flask_cli, disabled, subscribe):
    healthy = subscribe("https://hooks.partner.example/in")
    header, *listed = rows(flask_cli("webhooks", "list"))
    assert header == ["ID", "ORG", "URL", "ACTIVE", "CONSECUTIVE_FAILURES", "AUTO_DISABLED_AT",
                      "PENDING", "DEAD", "CONCURRENCY", "LIMIT"]
    by_id = {row[0]: row for row in listed}
    assert by_id[disabled["id"]][1:4] == ["acme", disabled["url"], "false"]
    assert by_id[disabled["id"]][4] == "2" and by_id[disabled["id"]][5].endswith("Z")
    assert by_id[disabled["id"]][6:] == ["0", "2", "auto", "1"]
    assert by_id[healthy["id"]][3:] == ["true", "0", "-", "0", "0", "auto", "1"]
    output = flask_cli("webhooks", "list").output
    assert disabled["secret"] not in output and healthy["secret"] not in output


def test_webhooks_list_filters(flask_cli, disabled, subscribe, issue_key, client):
    healthy = subscribe("https://hooks.partner.example/in")
    assert [row[0] for row in rows(flask_cli("webhooks", "list", "--disabled"))[1:]] == [disabled["id"]]
    issue_key(org="other")
    assert rows(flask_cli("webhooks", "list", "--org", "other"))[1:] == []
    assert {row[0] for row in rows(flask_cli("webhooks", "list", "--org", "acme"))[1:]} == \
        {disabled["id"], healthy["id"]}


def test_enable_restores_the_subscription_and_resends_nothing(flask_cli, disabled, run_due, recovering_receiver,
                                                              client, auth):
    result = flask_cli("webhooks", "enable", disabled["id"])
    assert result.exit_code == 0 and disabled["id"] in result.output
    listed = client.get(WEBHOOKS, headers=auth).get_json()["data"]
    state = next(s for s in listed if s["id"] == disabled["id"])
    assert (state["active"], state["auto_disabled_at"], state["consecutive_failures"]) == (True, None, 0)
    assert run_due() == 0 and len(recovering_receiver.received) == 2


def concurrency_listed(flask_cli, subscription: dict) -> list[str]:
    """Its CONCURRENCY and LIMIT in `flask webhooks list`."""
    return next(row[8:] for row in rows(flask_cli("webhooks", "list"))[1:] if row[0] == subscription["id"])


def test_set_concurrency_pins_a_subscription_and_auto_makes_it_adaptive_again(flask_cli, subscribe):
    subscription = subscribe("https://hooks.partner.example/in")
    result = flask_cli("webhooks", "set-concurrency", subscription["id"], "1")
    assert result.exit_code == 0
    assert result.output == f"Subscription {subscription['id']}: 1 attempt in flight, in order.\n"
    assert concurrency_listed(flask_cli, subscription) == ["1", "1"]
    assert flask_cli("webhooks", "set-concurrency", subscription["id"], "16").exit_code == 0
    assert concurrency_listed(flask_cli, subscription) == ["16", "16"]
    result = flask_cli("webhooks", "set-concurrency", subscription["id"], "auto")
    assert result.exit_code == 0 and "adaptive" in result.output
    assert concurrency_listed(flask_cli, subscription) == ["auto", "1"]  # from 1, as a new subscription


@pytest.mark.parametrize("value", ["0", "17", "2.5", "many", ""])
def test_set_concurrency_outside_1_to_the_most_is_a_usage_error_that_changes_nothing(flask_cli, subscribe, value):
    subscription = subscribe("https://hooks.partner.example/in")
    result = flask_cli("webhooks", "set-concurrency", subscription["id"], value)
    assert result.exit_code == 2 and "PARTNER_DELIVERY_MAX_PER_SUBSCRIPTION" in result.output
    assert concurrency_listed(flask_cli, subscription) == ["auto", "1"]


@pytest.mark.config(DELIVERY_MAX_PER_SUBSCRIPTION=4)
def test_the_listed_limit_is_never_above_the_most_configured(app, flask_cli, subscribe):
    subscription = subscribe("https://hooks.partner.example/in")
    with app.app_context(), db.connection_context():
        Subscription.update(concurrency_limit=9).execute()  # adapted while the most was higher
    assert concurrency_listed(flask_cli, subscription) == ["auto", "4"]
    assert flask_cli("webhooks", "set-concurrency", subscription["id"], "5").exit_code == 2


def test_set_concurrency_of_an_unknown_id_exits_1_naming_it(flask_cli):
    result = flask_cli("webhooks", "set-concurrency", "wh_nosuchsubscription0", "1")
    assert result.exit_code == 1 and "wh_nosuchsubscription0" in result.output


def test_enable_of_an_unknown_id_exits_1_naming_it(flask_cli):
    result = flask_cli("webhooks", "enable", "wh_nosuchsubscription0")
    assert result.exit_code == 1 and "wh_nosuchsubscription0" in result.output


def test_replay_is_refused_while_the_subscription_is_disabled(flask_cli, disabled, run_due, recovering_receiver):
    result = flask_cli("deliveries", "replay", "--subscription", disabled["id"])
    assert result.exit_code == 1 and "disabled" in result.output and disabled["id"] in result.output
    assert run_due() == 0 and len(recovering_receiver.received) == 2
    states = [row[2] for row in rows(flask_cli("deliveries", "list", "--subscription", disabled["id"]))[1:]]
    assert states == ["dead", "dead"]


def test_enable_then_replay_delivers_each_dead_letter_once_more_same_id_and_bytes(
        flask_cli, disabled, run_due, recovering_receiver):
    assert flask_cli("webhooks", "enable", disabled["id"]).exit_code == 0
    result = flask_cli("deliveries", "replay", "--subscription", disabled["id"])
    assert result.exit_code == 0 and "Queued 2 " in result.output
    assert run_due() == 2
    assert run_due() == 0
    first, replayed = recovering_receiver.received[:2], recovering_receiver.received[2:]
    assert len(replayed) == 2
    assert sorted(r.headers["X-VC-Event-Id"] for r in replayed) == sorted(disabled["events"])
    assert {r.headers["X-VC-Event-Id"]: r.body for r in replayed} == \
        {r.headers["X-VC-Event-Id"]: r.body for r in first}
    assert {r.headers["X-VC-Attempt"] for r in replayed} == {"1"}  # a fresh set of attempts
    listed = rows(flask_cli("deliveries", "list", "--subscription", disabled["id"]))[1:]
    assert [row[2:4] for row in listed] == [["delivered", "1"], ["delivered", "1"]]


def test_replay_of_one_event_or_since_a_time(flask_cli, disabled, run_due, recovering_receiver, clock):
    flask_cli("webhooks", "enable", disabled["id"])
    one = disabled["events"][0]
    assert "Queued 1 " in flask_cli("deliveries", "replay", "--subscription", disabled["id"],
                                    "--event", one).output
    assert run_due() == 1 and recovering_receiver.received[-1].headers["X-VC-Event-Id"] == one
    later = "2100-01-01T00:00:00Z"
    assert "Queued 0 " in flask_cli("deliveries", "replay", "--subscription", disabled["id"],
                                    "--since", later).output
    assert "Queued 1 " in flask_cli("deliveries", "replay", "--subscription", disabled["id"],
                                    "--since", "2000-01-01T00:00:00+01:00").output


@pytest.mark.parametrize("since", ["yesterday", "2026-11-22T10:00:00", "2026-13-01T00:00:00Z"])
def test_replay_refuses_a_time_that_is_not_rfc3339_with_an_offset(flask_cli, disabled, since):
    result = flask_cli("deliveries", "replay", "--subscription", disabled["id"], "--since", since)
    assert result.exit_code == 2 and "RFC 3339" in result.output


def test_deliveries_list_filters_by_state_and_limits(flask_cli, disabled, subscribe, ping):
    header, *listed = rows(flask_cli("deliveries", "list", "--subscription", disabled["id"],
                                     "--state", "dead", "--limit", "1"))
    assert header == ["EVENT_ID", "KIND", "STATE", "ATTEMPTS", "CREATED_AT", "DUE_OR_FINISHED_AT"]
    assert len(listed) == 1 and listed[0][1:4] == ["vc.test.ping", "dead", "1"]
    assert listed[0][5].endswith("Z")  # when its last attempt ended
    assert rows(flask_cli("deliveries", "list", "--subscription", disabled["id"], "--state", "pending"))[1:] == []
    queued = subscribe("https://hooks.partner.example/in")
    event = queued_event(ping, queued)
    pending = rows(flask_cli("deliveries", "list", "--subscription", queued["id"]))[1:]
    assert [row[:4] for row in pending] == [[event, "vc.test.ping", "pending", "0"]]


@pytest.mark.parametrize("command", [("deliveries", "list"), ("deliveries", "replay")])
def test_deliveries_of_an_unknown_subscription_exit_1_naming_it(flask_cli, command):
    result = flask_cli(*command, "--subscription", "wh_nosuchsubscription0")
    assert result.exit_code == 1 and "wh_nosuchsubscription0" in result.output


def queued_event(ping, subscription: dict) -> str:
    """Ping the subscription and return the queued event's id."""
    return json_of(ping(subscription), 202)["id"]


@pytest.mark.parametrize("limit", ["0", "10001", "99999999999999999999"])
def test_deliveries_list_refuses_a_limit_out_of_bounds_cleanly(flask_cli, limit):
    result = flask_cli("deliveries", "list", "--subscription", "wh_x", "--limit", limit)
    assert result.exit_code == 2 and "--limit" in result.output, result.output
