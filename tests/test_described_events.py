"""Every registered event type in the partner's document (CONTRACT §11, edge/described_events.py): its
description and its `data` schema inside SPEC's envelope, a valid OpenAPI 3.1 document, a type added or
retired seen within 5 seconds, the last document served while the database is down, and what a
receiver gets validates against it."""

import json

import pytest
from jsonschema import Draft202012Validator
from openapi_spec_validator import validate
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from models import db
from partner.event_types import add_event_type, retire_event_type
from tests.support import LEAD_SCHEMA, json_of, lead, started_app


def described(client) -> dict:
    response = client.get("/openapi.json")
    assert response.status_code == 200
    return response.get_json()


def schema_of(document: dict, name: str) -> Draft202012Validator:
    """A validator of `name` (a components schema), resolving its references inside the document."""
    registry = Registry().with_resource("urn:document", Resource.from_contents(document, DRAFT202012))
    return Draft202012Validator({"$ref": f"urn:document#/components/schemas/{name}"}, registry=registry)


def test_each_registered_type_is_a_webhook_with_its_description_and_schema(client, registered):
    document = described(client)
    validate(document)  # still valid OpenAPI 3.1
    assert sorted(document["webhooks"]) == ["intake.done", "lead.created", "lead.note.added", "vc.test.ping"]
    operation = document["webhooks"]["lead.created"]["post"]
    assert operation["description"].startswith("About lead.created.")
    headers = {p["name"]: p["schema"] for p in operation["parameters"]}
    assert headers["X-VC-Event"] == {"type": "string", "const": "lead.created"}
    assert set(headers) == {p["name"] for p in document["webhooks"]["vc.test.ping"]["post"]["parameters"]}
    assert document["components"]["schemas"]["lead.created.data"] == LEAD_SCHEMA
    assert document["components"]["schemas"]["intake.done.data"] == {"type": "object"}


def test_a_type_added_or_retired_shows_within_5_seconds(app, client, registered, clock):
    described(client)
    registered("order.paid")
    with app.app_context(), db.connection_context():
        retire_event_type("intake.done", int(clock() * 1000))
    clock.advance(5)
    assert sorted(described(client)["webhooks"]) == ["lead.created", "lead.note.added", "order.paid", "vc.test.ping"]


def test_a_schema_with_its_own_references_still_resolves(app, client, registered, clock):
    schema = {"$defs": {"id": {"type": "string", "pattern": "^ld_"}}, "type": "object",
              "properties": {"lead_id": {"$ref": "#/$defs/id"}}}
    registered("lead.merged", schema)
    document = described(client)
    validate(document)
    envelope = schema_of(document, "lead.merged.event")
    body = {"event": "lead.merged", "id": "evt_0b1b99f2-40ba-4769-bce4-0f17b91db6ca", "subscription_id": "wh_" + "x" * 20,
            "occurred_at": "2026-12-05T10:00:00.000Z"}
    assert envelope.is_valid({**body, "data": {"lead_id": "ld_1"}})
    assert not envelope.is_valid({**body, "data": {"lead_id": "x_1"}})


@pytest.mark.config(WEBHOOK_ALLOWED_NETWORKS=["127.0.0.0/8"])
def test_what_a_receiver_gets_validates_against_the_document(client, dispatcher, receiver, subscribe, publish):
    subscribe(receiver.url)
    json_of(publish(lead()), 202)
    dispatcher.run_due()
    [request] = receiver.received
    document = described(client)
    schema_of(document, "lead.created.event").validate(json.loads(request.body))
    headers = {p["name"].lower() for p in document["webhooks"]["lead.created"]["post"]["parameters"] if p["required"]}
    assert headers <= {name.lower() for name in request.headers}


def test_while_the_database_is_down_the_last_document_is_served(own_postgres_server, clock, resolver):
    app = started_app({"DATABASE_URL": own_postgres_server.url(own_postgres_server.create_schema()), "CLOCK": clock,
                       "RESOLVER": resolver, "SCHEDULER_ENABLED": False})
    with app.app_context(), db.connection_context():
        add_event_type("lead.created", None, None, int(clock() * 1000))
    client = app.test_client()
    assert "lead.created" in described(client)["webhooks"]
    own_postgres_server.pg_ctl("stop", "-m", "immediate", "-w")
    clock.advance(5)
    assert "lead.created" in described(client)["webhooks"]
