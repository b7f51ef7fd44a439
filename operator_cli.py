"""The operator CLI beside `flask keys`: `flask webhooks list|enable`, `flask deliveries list|replay`,
`flask db prune`. Thin: parse, call one domain function (operations, retention), print."""

from datetime import datetime

import click
from flask import current_app
from flask.cli import AppGroup

import retention
from models import db
from operations import (STATES, OperatorError, enable_subscription, list_deliveries,
                        replay_dead_letters, subscriptions_overview)
from timestamps import iso, now_ms, to_ms

webhooks_cli = AppGroup("webhooks", help="Inspect and re-enable webhook subscriptions.")
deliveries_cli = AppGroup("deliveries", help="Inspect deliveries and replay dead letters.")
db_cli = AppGroup("db", help="Database upkeep.")
COMMANDS = (webhooks_cli, deliveries_cli, db_cli)


class Rfc3339(click.ParamType):
    """An RFC 3339 time with its offset (`2026-11-22T10:15:30Z`), as Unix milliseconds."""
    name = "RFC3339"

    def convert(self, value, param, ctx):
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            moment = None
        if moment is None or moment.tzinfo is None:
            self.fail(f"{value!r} is not an RFC 3339 time with an offset, e.g. 2026-11-22T10:15:30Z",
                      param, ctx)
        return to_ms(moment.timestamp())


def _now() -> int:
    return now_ms(current_app.config["CLOCK"])


def _table(header: tuple, rows) -> None:
    click.echo("\t".join(header))
    for row in rows:
        click.echo("\t".join("-" if cell is None else str(cell) for cell in row))


def _run(operation, *args, **kwargs):
    """Run a domain operation on a connection; its refusal exits 1 with the message."""
    with db.connection_context():
        try:
            return operation(*args, **kwargs)
        except OperatorError as error:
            raise click.ClickException(str(error)) from None


@webhooks_cli.command("list")
@click.option("--org", help="Only this organization's subscriptions.")
@click.option("--disabled", is_flag=True, help="Only disabled subscriptions.")
def webhooks_list(org: str | None, disabled: bool) -> None:
    """List subscriptions with their open and dead deliveries (never a secret)."""
    rows = _run(subscriptions_overview, org, disabled)
    _table(("ID", "ORG", "URL", "ACTIVE", "CONSECUTIVE_FAILURES", "AUTO_DISABLED_AT", "PENDING", "DEAD"),
           ((s.id, s.organization.slug, s.url, str(s.active).lower(), s.consecutive_failures,
             iso(s.auto_disabled_at), s.pending, s.dead) for s in rows))


@webhooks_cli.command("enable")
@click.argument("subscription_id")
def webhooks_enable(subscription_id: str) -> None:
    """Re-enable an auto-disabled subscription; resends nothing by itself."""
    subscription = _run(enable_subscription, subscription_id)
    click.echo(f"Subscription {subscription.id} enabled. Its dead letters stay dead: "
               f"`flask deliveries replay --subscription {subscription.id}` sends them again.")


@deliveries_cli.command("list")
@click.option("--subscription", "subscription_id", required=True, help="Subscription id (wh_…).")
@click.option("--state", type=click.Choice(STATES), help="Only deliveries in this state.")
@click.option("--limit", type=click.IntRange(1, 10_000), default=50, show_default=True)
def deliveries_list(subscription_id: str, state: str | None, limit: int) -> None:
    """List a subscription's deliveries, newest first."""
    rows = _run(list_deliveries, subscription_id, state, limit)
    _table(("EVENT_ID", "KIND", "STATE", "ATTEMPTS", "CREATED_AT", "DUE_OR_FINISHED_AT"),
           ((r.event_id, r.kind, r.state, r.attempts, iso(r.created_at), iso(r.due_or_finished_at))
            for r in rows))


@deliveries_cli.command("replay")
@click.option("--subscription", "subscription_id", required=True, help="Subscription id (wh_…).")
@click.option("--since", type=Rfc3339(), help="Only events that occurred at or after this time.")
@click.option("--event", "event_id", help="Only this event (evt_…).")
def deliveries_replay(subscription_id: str, since: int | None, event_id: str | None) -> None:
    """Queue dead-lettered deliveries again: same event id and bytes, due now, fresh attempts."""
    queued = _run(replay_dead_letters, subscription_id, _now(), since, event_id)
    click.echo(f"Queued {queued} dead-lettered deliveries of {subscription_id} for delivery now.")


@db_cli.command("prune")
@click.option("--older-than", "days", type=click.IntRange(min=1),
              help="Days to keep [default: PARTNER_RETENTION_DAYS].")
def db_prune(days: int | None) -> None:
    """Run the retention job once, now: delete finished events older than DAYS."""
    days = days or current_app.config["RETENTION_DAYS"]
    before = retention.cutoff(_now(), days)
    pruned = _run(retention.prune, before)
    click.echo(f"Removed {pruned.events} events, {pruned.deliveries} deliveries and "
               f"{pruned.failures} failure records: delivered or dead-lettered, created before "
               f"{iso(before)} ({days} days).")
