"""The operator's side of platform events (CONTRACT §11): `flask publishers`, `flask event-types` and
`flask events publish`, run as an operator runs them against the app's database."""

import json

import pytest

from models import Delivery, Event, Publisher, db
from tests.support import EVENTS, LEAD_SCHEMA, WEBHOOKS, bearer, json_of, lead


@pytest.fixture
def flask_cli(app):
    runner = app.test_cli_runner()
    return lambda *args: runner.invoke(args=list(args))


def rows(result) -> list[list[str]]:
    assert result.exit_code == 0, result.output
    return [line.split("\t") for line in result.stdout.splitlines()]


def test_a_publisher_credential_is_printed_once_alone_and_stored_as_a_hash(app, flask_cli, client, registered):
    result = flask_cli("publishers", "create", "crm")
    assert result.exit_code == 0, result.output
    [credential] = result.stdout.splitlines()
    assert credential.startswith("vcp_") and credential not in result.stderr
    with app.app_context(), db.connection_context():
        [stored] = Publisher.select()
    assert credential.split(".", 1)[1] not in (stored.secret_hash, stored.name, stored.id)
    listed = rows(flask_cli("publishers", "list"))
    assert listed[0] == ["ID", "NAME", "CREATED_AT", "REVOKED_AT"] and listed[1][:2] == [stored.id, "crm"]
    assert credential not in flask_cli("publishers", "list").output
    assert client.post(EVENTS, json=lead(), headers=bearer(credential)).status_code == 202
    assert "revoked at" in flask_cli("publishers", "revoke", stored.id).output
    assert client.post(EVENTS, json=lead(), headers=bearer(credential)).status_code == 401


@pytest.mark.parametrize("name, refusal", [("crm", "exists already"), ("CRM", "1-64 of a-z"), ("x" * 65, "1-64 of a-z")])
def test_a_publisher_name_is_unique_and_plain(flask_cli, name, refusal):
    flask_cli("publishers", "create", "crm")
    result = flask_cli("publishers", "create", name)
    assert result.exit_code == 1 and refusal in result.output and "Traceback" not in result.output


@pytest.mark.both_databases
@pytest.mark.parametrize("command", [("publishers", "revoke", "nosuchpublisher0000"), ("publishers", "revoke", "x\x00y"),
                                     ("event-types", "retire", "no.such"), ("event-types", "retire", "no\x00such")])
def test_an_unknown_publisher_or_type_exits_1_naming_it(flask_cli, command):
    result = flask_cli(*command)
    assert result.exit_code == 1 and "No " in result.output and "Traceback" not in result.output


def test_event_types_are_added_changed_listed_and_retired(flask_cli, tmp_path, client, auth):
    schema = tmp_path / "lead.json"
    schema.write_text(json.dumps(LEAD_SCHEMA))
    assert flask_cli("event-types", "add", "lead.created", "--schema", str(schema)).output == "lead.created: added\n"
    assert flask_cli("event-types", "add", "lead.created", "--schema", str(schema)).output == "lead.created: unchanged\n"
    changed = flask_cli("event-types", "add", "lead.created", "--description", "A lead.")
    assert changed.output == "lead.created: description changed, schema changed\n"
    json_of(client.post(WEBHOOKS, json={"url": "https://hooks.partner.example/x", "events": ["lead.*"]}, headers=auth), 201)
    assert rows(flask_cli("event-types", "list")) == [["NAME", "DESCRIPTION", "SCHEMA", "RETIRED_AT", "SUBSCRIPTIONS"],
                                                      ["lead.created", "A lead.", "no", "-", "1"]]
    assert flask_cli("event-types", "retire", "lead.created").output == "lead.created: retired.\n"
    assert rows(flask_cli("event-types", "list"))[1][3] != "-"
    assert "no longer retired" in flask_cli("event-types", "add", "lead.created").output


@pytest.mark.parametrize("args, refusal", [
    (("vc.custom",), "the service's own"),
    (("Lead.Created",), "not an event type name"),
    (("lead",), "not an event type name"),
    (("lead." + "x" * 100,), "not an event type name"),
    (("lead.created", "--description", "evil \u202e text"), "plain text"),
    (("lead.created", "--description", "x" * 501), "at most 500 characters"),
])
def test_a_bad_event_type_name_is_refused_in_one_line(flask_cli, args, refusal):
    result = flask_cli("event-types", "add", *args)
    assert result.exit_code == 1 and refusal in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("text, refusal", [("{", "Not a valid JSON Schema"), ('{"type": "nothing"}', "Not a valid JSON Schema"),
                                           ('{"type": "object", "x": "' + "y" * 70_000 + '"}', "over 64 KiB")])
def test_a_schema_that_is_not_one_is_refused_in_one_line(flask_cli, tmp_path, text, refusal):
    path = tmp_path / "schema.json"
    path.write_text(text)
    result = flask_cli("event-types", "add", "lead.created", "--schema", str(path))
    assert result.exit_code == 1 and refusal in result.output and len(result.output.splitlines()) == 1


def test_a_schema_never_fetches_a_remote_reference(app, flask_cli, tmp_path, publish, subscribe):
    path = tmp_path / "schema.json"
    path.write_text(json.dumps({"$ref": "https://schemas.example/lead.json"}))
    assert flask_cli("event-types", "add", "lead.remote", "--schema", str(path)).exit_code == 0
    subscribe("https://hooks.partner.example/x")
    response = publish({"organization": "acme", "event": "lead.remote", "data": {}})
    assert response.status_code == 422 and response.get_json()["errors"][0]["code"] == "schema_mismatch"


def test_events_publish_does_what_the_endpoint_does(app, flask_cli, subscribe, registered, tmp_path):
    subscribe("https://hooks.partner.example/x")
    data = tmp_path / "data.json"
    data.write_text('{"lead_id": "ld_1"}')
    first = flask_cli("events", "publish", "--org", "acme", "--event", "lead.created", "--data", f"@{data}",
                      "--idempotency-key", "k")
    assert first.exit_code == 0, first.output
    answer = json.loads(first.stdout)
    assert (answer["event"], answer["organization"], answer["subscriptions"]) == ("lead.created", "acme", 1)
    again = flask_cli("events", "publish", "--org", "acme", "--event", "lead.created", "--data", '{"lead_id": "ld_1"}',
                      "--idempotency-key", "k")
    assert json.loads(again.stdout) == answer
    with app.app_context(), db.connection_context():
        assert (Event.select().count(), Delivery.select().count()) == (1, 1)


@pytest.mark.parametrize("args, said", [
    (("--event", "lead.created", "--data", '{"lead_id": 5}'), "data/lead_id: 5 is not of type 'string'"),
    (("--event", "nope.nope", "--data", "{}"), "No event type 'nope.nope' is registered"),
    (("--event", "lead.created", "--data", "{"), "--data is not JSON"),
])
def test_events_publish_refuses_in_one_line_on_stderr(flask_cli, registered, args, said):
    result = flask_cli("events", "publish", "--org", "acme", *args)
    assert result.exit_code == 1 and said in result.stderr and "Traceback" not in result.output
