"""`flask publishers`, `flask event-types` and `flask events`: the platform's events (CONTRACT §11).
Thin: parse, call one domain function, print."""

import json
from pathlib import Path

import click
from flask import current_app
from flask.cli import AppGroup

from partner.errors import ApiError, OperatorError
from partner.event_types import add_event_type, list_event_types, retire_event_type
from partner.operator.commands import now, run, starts, table
from partner.publishers import create_publisher, list_publishers, revoke_publisher
from partner.publishing import publish_once
from partner.startup import UP_TO_DATE
from partner.timestamps import iso

# The key space of `flask events publish`'s Idempotency-Keys: no publisher's id (those are 20 letters).
OPERATOR = "operator"

publishers_cli = AppGroup("publishers", help="Credentials of the platform's services that publish events.")


@publishers_cli.command("create")
@click.argument("name")
@starts(UP_TO_DATE)
def publishers_create(name: str) -> None:
    """Create a publisher; its credential is printed once, alone on stdout."""
    issued = run(create_publisher, name, now())
    click.echo(f"Created publisher {issued.publisher.id} ({name}). The credential is shown once:", err=True)
    click.echo(issued.credential)


@publishers_cli.command("list")
@starts(UP_TO_DATE)
def publishers_list() -> None:
    """List publishers (never their secrets)."""
    table(("ID", "NAME", "CREATED_AT", "REVOKED_AT"),
          ((p.id, p.name, iso(p.created_at), iso(p.revoked_at)) for p in run(list_publishers)))


@publishers_cli.command("revoke")
@click.argument("publisher_id")
@starts(UP_TO_DATE)
def publishers_revoke(publisher_id: str) -> None:
    """Revoke a publisher at once; every later request with it gets 401."""
    publisher = run(revoke_publisher, publisher_id, now())
    click.echo(f"Publisher {publisher.id} revoked at {iso(publisher.revoked_at)}.")


event_types_cli = AppGroup("event-types", help="The event types publishers may publish, and their schemas.")


@event_types_cli.command("add")
@click.argument("name")
@click.option("--description", help="What the event means, shown to partners in the API document.")
@click.option("--schema", "schema_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="A JSON Schema (draft 2020-12) file for the event's data.")
@starts(UP_TO_DATE)
def event_types_add(name: str, description: str | None, schema_file: Path | None) -> None:
    """Register an event type, or replace an existing one's description and schema."""
    schema = schema_file.read_text(errors="replace") if schema_file else None
    click.echo(run(add_event_type, name, description, schema, now()))


@event_types_cli.command("list")
@starts(UP_TO_DATE)
def event_types_list() -> None:
    """List event types: description, schema, retired, subscriptions filtering on it."""
    table(("NAME", "DESCRIPTION", "SCHEMA", "RETIRED_AT", "SUBSCRIPTIONS"),
          ((name, description, "yes" if schema else "no", iso(retired_at), count)
           for name, description, schema, retired_at, count in run(list_event_types)))


@event_types_cli.command("retire")
@click.argument("name")
@starts(UP_TO_DATE)
def event_types_retire(name: str) -> None:
    """Retire an event type: later publishes are refused; queued deliveries still go."""
    run(retire_event_type, name, now())
    click.echo(f"{name}: retired.")


events_cli = AppGroup("events", help="Publish a platform event as a publisher would.")


@events_cli.command("publish")
@click.option("--org", required=True, help="The organization's slug.")
@click.option("--event", "kind", required=True, help="A registered event type.")
@click.option("--data", required=True, help="The event's data: a JSON object, or @FILE.")
@click.option("--idempotency-key", help="Publish at most once with this key (24 hours).")
@starts(UP_TO_DATE)
def events_publish(org: str, kind: str, data: str, idempotency_key: str | None) -> None:
    """Publish one event to the organization's matching subscriptions; prints the answer."""
    text = Path(data[1:]).read_text(errors="replace") if data.startswith("@") else data
    try:
        body = {"organization": org, "event": kind, "data": json.loads(text)}
    except ValueError as error:
        raise click.ClickException(f"--data is not JSON: {error}") from None
    answer, _ = run(_publish, idempotency_key, body, current_app.config["BACKLOG_LIMIT"])
    click.echo(answer)


def _publish(idempotency_key: str | None, body: dict, backlog_limit: int) -> tuple[str, bool]:
    """publish_once as the operator, its refusal in the words of the endpoint's problem."""
    try:
        return publish_once(OPERATOR, idempotency_key, body, [body], "", now(), backlog_limit,
                            lambda accepted: accepted[0].json())
    except ApiError as error:
        details = "; ".join(f"{e['field']}: {e['message']}" for e in error.errors or [])
        raise OperatorError(f"{error.detail} {details}".strip()) from None
