"""The operator CLI, every `flask` command group: keys, orgs, webhooks, deliveries, db, encryption. Keys
have no HTTP endpoint. Thin: parse, call one domain function, print."""

import functools
from datetime import datetime

import click
from flask import current_app
from flask.cli import AppGroup

from partner.store.connection import db
from partner import resealing, retention, sealing
from partner.store import backup, migrations
from partner.store.availability import describe, is_unavailable
from partner.history import STATES, delivery_story, list_deliveries, replay_dead_letters
from partner.errors import OperatorError, ValidationError
from partner.keys import (DEFAULT_RATE_LIMIT, GRANTABLE_SCOPES, MAX_RATE_LIMIT, IssuedKey, create_key, list_keys,
                          revoke_key, rotate_key)
from partner.concurrency import effective_limit
from partner.organizations import list_organizations, set_rate_limit
from partner.retry import RetryPolicy
from partner.subscriptions import enable_subscription, set_concurrency, subscriptions_overview
from partner.startup import AS_IT_IS, NOTHING, UP_TO_DATE, start_command
from partner.timestamps import iso, now_ms, to_ms

def starts(needs: str, keys: bool = False):
    """Declare what a command needs of the start-up (partner/startup.py: NOTHING, AS_IT_IS or
    UP_TO_DATE; `keys`: it opens webhook secrets); that much runs before it."""
    def declare(command):
        @functools.wraps(command)
        def run(*args, **kwargs):
            start_command(current_app, needs, keys)
            return command(*args, **kwargs)
        return run
    return declare


keys_cli = AppGroup("keys", help="Issue, list, revoke and rotate partner API keys.")


def _now() -> int:
    return now_ms(current_app.config["CLOCK"])


def _announce(issued: IssuedKey) -> None:
    """Describe the key on stderr and print the full key alone on stdout's last line."""
    key = issued.key
    click.echo(f"Created key {key.key_id} for organization {key.organization.slug} "
               f"with scopes {key.scopes}. The full key is shown once:", err=True)
    click.echo(issued.full_key)


@keys_cli.command("create")
@click.option("--org", required=True, help="Organization slug; created on first use.")
@click.option("--scope", "scopes", multiple=True,
              help=f"A scope to grant (repeatable): {', '.join(sorted(GRANTABLE_SCOPES))}.")
@click.option("--rate-limit", type=click.IntRange(1, MAX_RATE_LIMIT),
              help=f"Requests per minute of a new organization [default: {DEFAULT_RATE_LIMIT}]; an existing "
                   "one keeps its own (`flask orgs set-limit`).")
@starts(UP_TO_DATE)
def create_command(org: str, scopes: tuple[str, ...], rate_limit: int | None) -> None:
    """Create a key; identity:read is always granted."""
    _announce(_run(create_key, org, list(scopes), _now(), rate_limit))


@keys_cli.command("list")
@click.option("--org", help="Only this organization's keys.")
@starts(UP_TO_DATE)
def list_command(org: str | None) -> None:
    """List keys (never their secrets)."""
    keys = _run(list_keys, org)
    click.echo("KEY_ID\tORG\tSCOPES\tRATE_LIMIT\tCREATED_AT\tREVOKED_AT")
    for key in keys:
        click.echo("\t".join([key.key_id, key.organization.slug, ",".join(sorted(key.scope_set)),
                              str(key.organization.rate_limit_per_minute), iso(key.created_at),
                              iso(key.revoked_at) or "-"]))


@keys_cli.command("revoke")
@click.argument("key_id")
@starts(UP_TO_DATE)
def revoke_command(key_id: str) -> None:
    """Revoke a key at once; every later request with it gets 401."""
    key = _run(revoke_key, key_id, _now())
    if key is None:
        raise click.ClickException(f"No key {key_id!r}.")
    click.echo(f"Key {key_id} revoked at {iso(key.revoked_at)}.")


@keys_cli.command("rotate")
@click.argument("key_id")
@starts(UP_TO_DATE)
def rotate_command(key_id: str) -> None:
    """Create a key with the same organization, scopes and limit, and revoke the old one."""
    issued = _run(rotate_key, key_id, _now())
    if issued is None:
        raise click.ClickException(f"No active key {key_id!r}.")
    click.echo(f"Key {key_id} revoked.", err=True)
    _announce(issued)


orgs_cli = AppGroup("orgs", help="Organizations: their rate limits, keys, subscriptions and deliveries.")


@orgs_cli.command("list")
@starts(UP_TO_DATE)
def orgs_list() -> None:
    """List organizations: limit, active keys, subscriptions, open and dead deliveries."""
    _table(("SLUG", "RATE_LIMIT_PER_MINUTE", "ACTIVE_KEYS", "SUBSCRIPTIONS", "PENDING", "DEAD"),
           (org.row() for org in _run(list_organizations)))


@orgs_cli.command("set-limit")
@click.argument("slug")
@click.argument("per_minute", type=click.IntRange(1, MAX_RATE_LIMIT))
@starts(UP_TO_DATE)
def orgs_set_limit(slug: str, per_minute: int) -> None:
    """Set the organization's requests per minute, shared by all its keys, from their next request."""
    _run(set_rate_limit, slug, per_minute)
    click.echo(f"Organization {slug} now has {per_minute} requests per minute, for every key.")


webhooks_cli = AppGroup("webhooks", help="Inspect and re-enable webhook subscriptions, and set their concurrency.")
deliveries_cli = AppGroup("deliveries", help="Inspect deliveries and replay dead letters.")
db_cli = AppGroup("db", help="Database upkeep: schema versions, backups, retention.")
encryption_cli = AppGroup("encryption", help="Keys that seal webhook secrets at rest.")
COMMANDS = (keys_cli, orgs_cli, webhooks_cli, deliveries_cli, db_cli, encryption_cli)


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


def _table(header: tuple, rows) -> None:
    click.echo("\t".join(header))
    for row in rows:
        click.echo("\t".join("-" if cell is None else str(cell) for cell in row))


def _run(operation, *args, **kwargs):
    """Run a domain operation on a connection; its refusal exits 1 with the message."""
    with db.connection_context():
        return _unless_refused(operation, *args, **kwargs)


def _unless_refused(operation, *args, **kwargs):
    """Run a domain operation; its refusal exits 1 with the message, and so does a database that
    could not complete it (down, full, or rolling it back to end a deadlock with the service: what
    it had not committed did not change; a command that works in batches keeps those it finished)."""
    try:
        return operation(*args, **kwargs)
    except OperatorError as error:
        raise click.ClickException(str(error)) from None
    except ValidationError as error:
        raise click.ClickException(" ".join(e["message"] for e in error.errors)) from None
    except Exception as error:  # noqa: BLE001 - sorted by is_unavailable, the rest re-raised
        if not is_unavailable(error):
            raise
        raise click.ClickException(f"the database could not complete the command: {describe(error)}") from None


@webhooks_cli.command("list")
@click.option("--org", help="Only this organization's subscriptions.")
@click.option("--disabled", is_flag=True, help="Only disabled subscriptions.")
@starts(UP_TO_DATE)
def webhooks_list(org: str | None, disabled: bool) -> None:
    """List subscriptions with their open and dead deliveries, and their concurrency (never a secret)."""
    rows = _run(subscriptions_overview, org, disabled)
    most = current_app.config["DELIVERY_MAX_PER_SUBSCRIPTION"]
    _table(("ID", "ORG", "URL", "ACTIVE", "CONSECUTIVE_FAILURES", "AUTO_DISABLED_AT", "PENDING", "DEAD",
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
    subscription = _run(set_concurrency, subscription_id, concurrency)
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
    subscription = _run(enable_subscription, subscription_id)
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
    rows = _run(list_deliveries, subscription_id, org, state, since, limit)
    _table(("EVENT_ID", "SUBSCRIPTION", "ORG", "KIND", "STATE", "ATTEMPTS", "CREATED_AT", "DUE_OR_FINISHED_AT"),
           ((r.event_id, r.subscription_id, r.organization, r.kind, r.state, r.attempts, iso(r.created_at),
             iso(r.due_or_finished_at)) for r in rows))


@deliveries_cli.command("show")
@click.argument("event_id")
@click.option("--subscription", "subscription_id", help="The event's subscription (wh_…), to check.")
@starts(UP_TO_DATE)
def deliveries_show(event_id: str, subscription_id: str | None) -> None:
    """One event: its subscription, every attempt in order, and why it ended or when it is next due."""
    config = current_app.config
    story = _run(delivery_story, event_id, _now(),
                 RetryPolicy(config["DELIVERY_RETRY_DELAYS"], config["AUTO_DISABLE_THRESHOLD"]), subscription_id)
    subscription = story.subscription
    lines = [("event", story.event_id), ("kind", story.kind), ("created_at", iso(story.created_at)),
             ("subscription", f"{subscription.id} ({_subscription_state(subscription)})"),
             ("organization", subscription.organization.slug), ("url", subscription.url), ("state", story.state)]
    if story.unrecorded:
        lines.append(("unrecorded", f"{story.unrecorded} attempts whose outcome was never written"))
    lines.append(("ended" if story.has_ended else "next", story.ending))
    for name, value in lines:
        click.echo(f"{name + ':':<14}{value}")
    click.echo()
    _table(("ATTEMPT", "ATTEMPTED_AT", "OUTCOME", "HTTP_STATUS", "ERROR", "ERROR_DETAIL", "DURATION_MS", "EXCERPT"),
           ((a.number, iso(a.attempted_at) or "not recorded", a.outcome, a.http_status, a.error, a.error_detail,
             a.duration_ms, _one_line(a.excerpt) or None) for a in story.attempts))


def _subscription_state(subscription) -> str:
    if subscription.deleted_at:
        return f"deleted at {iso(subscription.deleted_at)}"
    if not subscription.active:
        return f"disabled: auto-disabled at {iso(subscription.auto_disabled_at)}"
    return "active"


def _one_line(text: str) -> str:
    """A response excerpt in one table cell: its backslashes, tabs and line breaks escaped."""
    return text.replace("\\", "\\\\").replace("\t", "\\t").replace("\r", "\\r").replace("\n", "\\n")


@deliveries_cli.command("replay")
@click.option("--subscription", "subscription_id", required=True, help="Subscription id (wh_…).")
@click.option("--since", type=Rfc3339(), help="Only events that occurred at or after this time.")
@click.option("--event", "event_id", help="Only this event (evt_…).")
@starts(UP_TO_DATE)
def deliveries_replay(subscription_id: str, since: int | None, event_id: str | None) -> None:
    """Queue dead-lettered deliveries again: same event id and bytes, due now, fresh attempts."""
    queued = _run(replay_dead_letters, subscription_id, _now(), since, event_id)
    click.echo(f"Queued {queued} dead-lettered deliveries of {subscription_id} for delivery now.")


@db_cli.command("prune")
@click.option("--older-than", "days", type=click.IntRange(1, retention.MAX_DAYS),
              help="Days to keep [default: PARTNER_RETENTION_DAYS].")
@starts(UP_TO_DATE)
def db_prune(days: int | None) -> None:
    """Run the retention job once, now: delete finished events older than DAYS."""
    days = days or current_app.config["RETENTION_DAYS"]
    before = retention.cutoff(_now(), days)
    pruned = _run(retention.prune, before)
    click.echo(f"Removed {pruned.events} events, {pruned.deliveries} deliveries and "
               f"{pruned.failures} failure records: delivered or dead-lettered, created before "
               f"{iso(before)} ({days} days).")


@db_cli.command("status")
@click.pass_context
@starts(AS_IT_IS)
def db_status(ctx: click.Context) -> None:
    """Schema version of the database and of the code; exit 0 up to date, 1 pending, 2 newer."""
    with db.connection_context():
        current = migrations.status(db.obj)
    click.echo(f"database schema version {current.version}, code's latest {current.latest}")
    if current.empty:  # not one made by release 1.0 or 1.1, which has the same version 0
        click.echo("empty database: the first start or `flask db upgrade` makes it from schema.sql")
    for name in current.pending:
        click.echo(f"pending: {name}")
    for name in current.scrub_owed:
        click.echo(f"scrub owed after {name}: `flask db upgrade` (or the next start) runs it")
    for name in current.unknown:
        click.echo(f"applied by a newer release: {name}")
    ctx.exit(2 if current.is_newer else 0 if current.is_up_to_date else 1)


@db_cli.command("upgrade")
@starts(AS_IT_IS, keys=True)
def db_upgrade() -> None:
    """Apply pending migrations under the migration lock (a no-op when up to date)."""
    try:
        applied = migrations.upgrade(db.obj)
    except migrations.SchemaTooNew as error:
        raise click.ClickException(str(error)) from None
    for name in applied:
        click.echo(f"applied: {name}")
    click.echo(f"schema version {migrations.number(applied[-1]) if applied else 'unchanged'}: up to date")


@db_cli.command("backup")
@click.argument("path")
@starts(AS_IT_IS)
def db_backup(path: str) -> None:
    """SQLite: a consistent, verified, fsynced copy at PATH while the service serves."""
    made = _unless_refused(backup.backup, current_app.config["DATABASE_URL"], path)
    click.echo(f"backup {made.path}: {made.bytes} bytes, schema {made.version}, integrity ok")


@db_cli.command("restore")
@click.argument("path")
@starts(NOTHING)
def db_restore(path: str) -> None:
    """SQLite: put the verified copy at PATH in place (every service stopped); the current file is kept aside."""
    restored = _unless_refused(backup.restore, current_app.config["DATABASE_URL"], path)
    for aside in restored.moved_aside:
        click.echo(f"moved aside: {aside}")
    click.echo(f"restored {path} (schema {restored.version}) as "
               f"{backup.sqlite_path(current_app.config['DATABASE_URL'])}; the next start applies any pending "
               f"migrations")


@encryption_cli.command("new-key")
@starts(NOTHING)
def encryption_new_key() -> None:
    """Print a fresh key for PARTNER_ENCRYPTION_KEYS on the last line."""
    click.echo("Put it first in PARTNER_ENCRYPTION_KEYS, keep the old keys after it, restart, then run "
               "`flask encryption rotate`:", err=True)
    click.echo(sealing.new_key())


@encryption_cli.command("rotate")
@starts(UP_TO_DATE, keys=True)
def encryption_rotate() -> None:
    """Re-seal every webhook secret under the first key, in small batches, while the service runs."""
    rotated = _run(resealing.rotate)
    if rotated.skipped:
        click.echo(f"Re-sealed {rotated.resealed} webhook secrets under key id {rotated.key_id}; "
                   f"{rotated.skipped} skipped: their secrets do not open (each named in the log) and stay "
                   f"sealed as before, so keep every key until they are dealt with.")
        raise click.exceptions.Exit(1)
    click.echo(f"Re-sealed {rotated.resealed} webhook secrets under key id {rotated.key_id}; every "
               f"secret is now sealed under it, and keys after it may be removed.")
