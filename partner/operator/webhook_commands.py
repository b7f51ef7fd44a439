"""`flask webhooks` and `flask deliveries`: subscriptions' state and concurrency, and each delivery's
story, the operator's "why did this delivery fail?". Thin: parse, call one domain function, print."""

import click
from flask import current_app
from flask.cli import AppGroup

from partner.concurrency import effective_limit
from partner.history import STATES, delivery_stories, list_deliveries, replay_dead_letters
from partner.operator.commands import Rfc3339, now, run, starts, table
from partner.retry import RetryPolicy
from partner.safe_text import printable
from partner.startup import UP_TO_DATE
from partner.subscriptions import enable_subscription, set_concurrency, subscriptions_overview
from partner.timestamps import iso

webhooks_cli = AppGroup("webhooks", help="Inspect and re-enable webhook subscriptions, and set their concurrency.")
deliveries_cli = AppGroup("deliveries", help="Inspect deliveries and replay dead letters.")


@webhooks_cli.command("list")
@click.option("--org", help="Only this organization's subscriptions.")
@click.option("--disabled", is_flag=True, help="Only disabled subscriptions.")
@starts(UP_TO_DATE)
def webhooks_list(org: str | None, disabled: bool) -> None:
    """List subscriptions with their open and dead deliveries, and their concurrency (never a secret)."""
    rows = run(subscriptions_overview, org, disabled)
    most = current_app.config["DELIVERY_MAX_PER_SUBSCRIPTION"]
    table(("ID", "ORG", "URL", "ACTIVE", "CONSECUTIVE_FAILURES", "AUTO_DISABLED_AT", "PENDING", "DEAD",
           "CONCURRENCY", "LIMIT"),
          ((s.id, s.organization.slug, s.url, str(s.active).lower(), s.consecutive_failures,
            iso(s.auto_disabled_at), s.pending, s.dead, "auto" if s.concurrency_pin is None else s.concurrency_pin,
            effective_limit(s.concurrency_pin, s.concurrency_limit, most)) for s in rows))


class Concurrency(click.ParamType):
    """`auto` (None) or a whole number of attempts in flight, 1 or more; the command checks the most."""
    name = "N|auto"

    def convert(self, value, param, ctx):
        if value == "auto" or isinstance(value, int):
            return None if value == "auto" else value
        if not (value.isdigit() and int(value) >= 1):
            self.fail(f"{value!r} is neither auto nor a whole number from 1 to "
                      "PARTNER_DELIVERY_MAX_PER_SUBSCRIPTION", param, ctx)
        return int(value)


@webhooks_cli.command("set-concurrency")
@click.argument("subscription_id")
@click.argument("concurrency", type=Concurrency())
@starts(UP_TO_DATE)
def webhooks_set_concurrency(subscription_id: str, concurrency: int | None) -> None:
    """Pin the most attempts in flight to a subscription (1: one at a time, in order), or `auto`."""
    most = current_app.config["DELIVERY_MAX_PER_SUBSCRIPTION"]
    if concurrency is not None and concurrency > most:
        raise click.BadParameter(f"{concurrency} is above {most}, the most attempts in flight to one "
                                 "subscription (PARTNER_DELIVERY_MAX_PER_SUBSCRIPTION)", param_hint="'N|auto'")
    subscription = run(set_concurrency, subscription_id, concurrency)
    if concurrency is None:
        click.echo(f"Subscription {subscription.id}: adaptive, from 1 attempt in flight up to {most} as its "
                   "receiver keeps up.")
    elif concurrency == 1:
        click.echo(f"Subscription {subscription.id}: 1 attempt in flight, in order.")
    else:
        click.echo(f"Subscription {subscription.id}: at most {concurrency} attempts in flight; they start "
                   "in order and may end out of it.")


@webhooks_cli.command("enable")
@click.argument("subscription_id")
@starts(UP_TO_DATE)
def webhooks_enable(subscription_id: str) -> None:
    """Re-enable an auto-disabled subscription; resends nothing by itself."""
    subscription = run(enable_subscription, subscription_id)
    click.echo(f"Subscription {subscription.id} enabled. Its dead letters stay dead: "
               f"`flask deliveries replay --subscription {subscription.id}` sends them again.")


@deliveries_cli.command("list")
@click.option("--subscription", "subscription_id", help="Only this subscription's (wh_…).")
@click.option("--org", help="Only this organization's.")
@click.option("--state", type=click.Choice(STATES), help="Only deliveries in this state.")
@click.option("--since", type=Rfc3339(), help="Only events that occurred at or after this time.")
@click.option("--limit", type=click.IntRange(1, 10_000), default=50, show_default=True)
@starts(UP_TO_DATE)
def deliveries_list(subscription_id: str | None, org: str | None, state: str | None, since: int | None,
                    limit: int) -> None:
    """List deliveries across subscriptions, newest event first."""
    rows = run(list_deliveries, subscription_id, org, state, since, limit)
    table(("EVENT_ID", "SUBSCRIPTION", "ORG", "KIND", "STATE", "ATTEMPTS", "CREATED_AT", "DUE_OR_FINISHED_AT"),
          ((r.event_id, r.subscription_id, r.organization, r.kind, r.state, r.attempts, iso(r.created_at),
            iso(r.due_or_finished_at)) for r in rows))


@deliveries_cli.command("show")
@click.argument("event_id")
@click.option("--subscription", "subscription_id", help="The event's subscription (wh_…), to check.")
@starts(UP_TO_DATE)
def deliveries_show(event_id: str, subscription_id: str | None) -> None:
    """One event: its delivery to each subscription, every attempt in order, and why it ended or when
    it is next due."""
    config = current_app.config
    stories = run(delivery_stories, event_id, now(),
                  RetryPolicy(config["DELIVERY_RETRY_DELAYS"], config["AUTO_DISABLE_THRESHOLD"]), subscription_id)
    for number, story in enumerate(stories):
        if number:
            click.echo()
        _show(story)


def _show(story) -> None:
    subscription = story.subscription
    lines = [("event", story.event_id), ("kind", story.kind), ("created_at", iso(story.created_at)),
             ("subscription", f"{subscription.id} ({_subscription_state(subscription)})"),
             ("organization", subscription.organization.slug), ("url", subscription.url), ("state", story.state)]
    if story.unrecorded:
        lines.append(("unrecorded", f"{story.unrecorded} attempts whose outcome was never written"))
    lines.append(("ended" if story.has_ended else "next", story.ending))
    for name, value in lines:
        click.echo(f"{name + ':':<14}{printable(str(value))}")
    click.echo()
    table(("ATTEMPT", "ATTEMPTED_AT", "OUTCOME", "HTTP_STATUS", "ERROR", "ERROR_DETAIL", "DURATION_MS", "EXCERPT"),
          ((a.number, iso(a.attempted_at) or "not recorded", a.outcome, a.http_status, a.error, a.error_detail,
            a.duration_ms, _one_line(a.excerpt) or None) for a in story.attempts))


def _subscription_state(subscription) -> str:
    if subscription.deleted_at:
        return f"deleted at {iso(subscription.deleted_at)}"
    if not subscription.active:
        return f"disabled: auto-disabled at {iso(subscription.auto_disabled_at)}"
    return "active"


def _one_line(text: str) -> str:
    """A response excerpt in one table cell: its backslashes doubled, so that the escapes table()
    writes for its tabs, line breaks and other controls read apart from the receiver's own."""
    return text.replace("\\", "\\\\")


@deliveries_cli.command("replay")
@click.option("--subscription", "subscription_id", required=True, help="Subscription id (wh_…).")
@click.option("--since", type=Rfc3339(), help="Only events that occurred at or after this time.")
@click.option("--event", "event_id", help="Only this event (evt_…).")
@starts(UP_TO_DATE)
def deliveries_replay(subscription_id: str, since: int | None, event_id: str | None) -> None:
    """Queue dead-lettered deliveries again: same event id and bytes, due now, fresh attempts."""
    queued = run(replay_dead_letters, subscription_id, now(), since, event_id)
    click.echo(f"Queued {queued} dead-lettered deliveries of {subscription_id} for delivery now.")
