"""`flask webhooks list|enable` and `flask deliveries list|replay` (docs/operations.md), through the real
app and CLI, with real receivers on 127.0.0.1 and the queue stepped with run_due()."""

import re
from pathlib import Path

import pytest

from models import Subscription, db
from partner.timestamps import iso
from tests.support import WEBHOOKS, json_of, run_through_backoffs, started_app



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
def disabled(app, subscribe, ping, clock, recovering_receiver):
    """A subscription auto-disabled by two failed events, now dead letters; its recovering_receiver now says 200."""
    subscription = subscribe(recovering_receiver.url)
    subscription["events"] = [queued_event(ping, subscription), queued_event(ping, subscription)]
    assert run_through_backoffs(app.extensions["delivery"], clock) == 2
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
    states = [row[4] for row in rows(flask_cli("deliveries", "list", "--subscription", disabled["id"]))[1:]]
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
    assert [row[4:6] for row in listed] == [["delivered", "1"], ["delivered", "1"]]


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
    assert header == ["EVENT_ID", "SUBSCRIPTION", "ORG", "KIND", "STATE", "ATTEMPTS", "CREATED_AT",
                      "DUE_OR_FINISHED_AT"]
    assert len(listed) == 1 and listed[0][1:6] == [disabled["id"], "acme", "vc.test.ping", "dead", "1"]
    assert listed[0][7].endswith("Z")  # when its last attempt ended
    assert rows(flask_cli("deliveries", "list", "--subscription", disabled["id"], "--state", "pending"))[1:] == []
    queued = subscribe("https://hooks.partner.example/in")
    event = queued_event(ping, queued)
    pending = rows(flask_cli("deliveries", "list", "--subscription", queued["id"]))[1:]
    assert [row[:6] for row in pending] == [[event, queued["id"], "acme", "vc.test.ping", "pending", "0"]]


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


# --- deliveries show: one event's story; deliveries list across subscriptions ----------------------

RETRYING = {"WEBHOOK_ALLOWED_NETWORKS": ["127.0.0.0/8"], "DELIVERY_RETRY_DELAYS": [60],
            "AUTO_DISABLE_THRESHOLD": 5}


def shown(result) -> tuple[dict, list[list[str]]]:
    """`deliveries show`'s fields by name, and its attempts table (header first)."""
    assert result.exit_code == 0, result.output
    head, table = result.stdout.split("\n\n")
    fields = {name: value.strip() for name, value in (line.split(":", 1) for line in head.splitlines())}
    return fields, [line.split("\t") for line in table.splitlines()]


@pytest.mark.config(**RETRYING)
def test_show_tells_a_failure_then_a_success_in_order(flask_cli, start_receiver, subscribe, ping, run_due, clock,
                                                      client, auth):
    def broken(handler):
        body = b"down\tfor\nmaintenance\\"
        handler.send_response(503)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)
    subscription = subscribe(start_receiver(script=[broken, 200]).url)
    event = queued_event(ping, subscription)
    assert run_due() == 1
    [failure] = client.get(f"{WEBHOOKS}/{subscription['id']}/failures", headers=auth).get_json()["data"]
    fields, table = shown(flask_cli("deliveries", "show", event))
    assert (fields["state"], fields["next"]) == ("pending", f"attempt 2 of at most 2 due at {failure['next_attempt_at']}")
    clock.advance(70)
    assert run_due() == 1
    fields, table = shown(flask_cli("deliveries", "show", event, "--subscription", subscription["id"]))
    assert (fields["state"], fields["ended"]) == ("delivered", "delivered on attempt 2")
    assert table == [
        ["ATTEMPT", "ATTEMPTED_AT", "OUTCOME", "HTTP_STATUS", "ERROR", "ERROR_DETAIL", "DURATION_MS", "EXCERPT"],
        ["1", failure["attempted_at"], "failed", "503", "http_status", "-", str(failure["duration_ms"]),
         "down\\tfor\\nmaintenance\\\\"],
        ["2", "not recorded", "delivered", "-", "-", "-", "-", "-"],
    ]


@pytest.mark.config(WEBHOOK_ALLOWED_NETWORKS=["127.0.0.0/8"], DELIVERY_RETRY_DELAYS=[60], AUTO_DISABLE_THRESHOLD=1)
def test_show_says_a_delivery_ended_by_an_auto_disable(flask_cli, start_receiver, subscribe, ping, run_due):
    subscription = subscribe(start_receiver(script=[500]).url)
    failing, swept = queued_event(ping, subscription), queued_event(ping, subscription)
    assert run_due() == 1
    for event, attempts in ((failing, 1), (swept, 0)):
        fields, table = shown(flask_cli("deliveries", "show", event))
        assert fields["subscription"].startswith(f"{subscription['id']} (disabled: auto-disabled at ")
        assert fields["ended"].startswith("auto-disabled: the subscription was auto-disabled at ")
        assert fields["ended"].endswith(f"after 1 failures in a row, and this delivery was dead-lettered after "
                                        f"{attempts} of at most 2 attempts")
        assert len(table) == 1 + attempts


@pytest.mark.parametrize("args", [("evt_nosuchevent",), ("evt_no\x00such",)])
def test_show_of_an_unknown_event_exits_1_naming_it(flask_cli, args):
    result = flask_cli("deliveries", "show", *args)
    assert result.exit_code == 1 and repr(args[0]) in result.output


def test_show_of_an_event_of_another_subscription_exits_1(flask_cli, disabled, subscribe):
    other = subscribe("https://hooks.partner.example/in")
    result = flask_cli("deliveries", "show", disabled["events"][0], "--subscription", other["id"])
    assert result.exit_code == 1 and other["id"] in result.output


def test_list_without_a_subscription_covers_them_all_and_filters(flask_cli, disabled, subscribe, ping, clock,
                                                                client, auth, issue_key):
    clock.advance(60)
    queued = subscribe("https://hooks.partner.example/in")
    later = queued_event(ping, queued)
    gone = subscribe("https://hooks.partner.example/gone")
    queued_event(ping, gone)
    client.delete(f"{WEBHOOKS}/{gone['id']}", headers=auth)  # its history waits for the purge, unlisted
    listed = [row[0] for row in rows(flask_cli("deliveries", "list"))[1:]]
    assert listed[0] == later and sorted(listed[1:]) == sorted(disabled["events"])
    since = rows(flask_cli("deliveries", "list", "--since", iso(int(clock() * 1000))))[1:]
    assert [row[0] for row in since] == [later]
    assert [row[0] for row in rows(flask_cli("deliveries", "list", "--limit", "1"))[1:]] == [later]
    issue_key(org="quiet")
    assert rows(flask_cli("deliveries", "list", "--org", "quiet"))[1:] == []


def test_list_of_an_unknown_organization_exits_1_naming_it(flask_cli):
    result = flask_cli("deliveries", "list", "--org", "nosuchorg")
    assert result.exit_code == 1 and "nosuchorg" in result.output


def test_the_alert_rules_hints_run_as_written(flask_cli, disabled):
    rules = (Path(__file__).parent.parent / "deploy" / "prometheus" / "alerts.yml").read_text()
    hints = re.findall(r"`flask ([^`]+)`", rules)
    assert "deliveries list --state dead" in hints
    for hint in hints:
        result = flask_cli(*hint.replace("EVT_ID", disabled["events"][0]).split())
        assert result.exit_code == 0, (hint, result.output)
        assert len(result.stdout.splitlines()) > 1, hint  # each finds what its alert is about


HOSTILE = "\x1b[2J\x1b]0;pwned\x07\x9b31m\x9d8;;\u202eevil\u2028"


@pytest.mark.config(**RETRYING)
@pytest.mark.parametrize("answer", ["location", "body"])
def test_show_prints_no_control_or_bidi_character_a_receiver_sent(flask_cli, start_receiver, subscribe, ping,
                                                                    run_due, answer):
    def hostile(handler):
        body = HOSTILE.encode() if answer == "body" else b""
        head = (b"HTTP/1.1 302 Fo\x1b[1mund\r\nLocation: https://x.example/" + HOSTILE.encode() + b"\r\n"
                if answer == "location" else b"HTTP/1.1 500 \x9b\x1b[31mOops\r\n")
        handler.wfile.write(head + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
        handler.close_connection = True
    subscription = subscribe(start_receiver(script=[hostile]).url)
    event = queued_event(ping, subscription)
    assert run_due() == 1
    result = flask_cli("deliveries", "show", event)
    assert result.exit_code == 0, result.output
    printed = result.stdout + flask_cli("deliveries", "list").stdout
    assert not [ch for ch in printed if ch != "\n" and ch != "\t" and (ord(ch) < 0x20 or 0x7F <= ord(ch) < 0xA0
                                                                       or ch in "\u202e\u2028")]
    assert "\\x9" in printed or "\\x8" in printed  # C1 bytes (also those of U+202E read as Latin-1) escaped, not dropped


@pytest.mark.config(WEBHOOK_ALLOWED_NETWORKS=["127.0.0.0/8"], DELIVERY_RETRY_DELAYS=[60], AUTO_DISABLE_THRESHOLD=1)
def test_why_a_dead_letter_ended_is_read_as_recorded_whatever_the_settings_are_now(config, flask_cli, start_receiver,
                                                                                 subscribe, ping, run_due, clock):
    subscription = subscribe(start_receiver(script=[500]).url)
    failing = queued_event(ping, subscription)
    assert run_due() == 1
    ended = shown(flask_cli("deliveries", "show", failing))[0]["ended"]
    assert ended.endswith("after 1 failures in a row, and this delivery was dead-lettered after 1 of at most 2 attempts")
    for settings in ({"DELIVERY_RETRY_DELAYS": [1, 2, 3, 4], "AUTO_DISABLE_THRESHOLD": 20}, {}):
        # Another schedule and threshold, then the defaults: what the operator runs the CLI with.
        other = started_app({**config, **settings} if settings else {"DATABASE_URL": config["DATABASE_URL"]})
        result = other.test_cli_runner().invoke(args=["deliveries", "show", failing])
        assert shown(result)[0]["ended"] == ended
