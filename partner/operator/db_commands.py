"""`flask db` and `flask encryption`: schema versions, backups and retention, and the keys that seal
webhook secrets at rest. Thin: parse, call one domain function, print."""

import click
from flask import current_app
from flask.cli import AppGroup

from partner import resealing, retention, sealing
from partner.config import MAX_DAYS
from partner.operator.commands import now, run, starts, unless_refused
from partner.startup import AS_IT_IS, NOTHING, UP_TO_DATE
from partner.store import backup, migrations
from partner.store.connection import db
from partner.timestamps import iso

db_cli = AppGroup("db", help="Database upkeep: schema versions, backups, retention.")
encryption_cli = AppGroup("encryption", help="Keys that seal webhook secrets at rest.")


@db_cli.command("prune")
@click.option("--older-than", "days", type=click.IntRange(1, MAX_DAYS),
              help="Days to keep [default: PARTNER_RETENTION_DAYS].")
@starts(UP_TO_DATE)
def db_prune(days: int | None) -> None:
    """Run the retention job once, now: delete finished events older than DAYS."""
    days = days or current_app.config["RETENTION_DAYS"]
    before = retention.cutoff(now(), days)
    pruned = run(retention.prune, before)
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
    made = unless_refused(backup.backup, current_app.config["DATABASE_URL"], path)
    click.echo(f"backup {made.path}: {made.bytes} bytes, schema {made.version}, integrity ok")


@db_cli.command("restore")
@click.argument("path")
@starts(NOTHING)
def db_restore(path: str) -> None:
    """SQLite: put the verified copy at PATH in place (every service stopped); the current file is kept aside."""
    restored = unless_refused(backup.restore, current_app.config["DATABASE_URL"], path)
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
    rotated = run(resealing.rotate)
    if rotated.skipped:
        click.echo(f"Re-sealed {rotated.resealed} webhook secrets under key id {rotated.key_id}; "
                   f"{rotated.skipped} skipped: their secrets do not open (each named in the log) and stay "
                   f"sealed as before, so keep every key until they are dealt with.")
        raise click.exceptions.Exit(1)
    click.echo(f"Re-sealed {rotated.resealed} webhook secrets under key id {rotated.key_id}; every "
               f"secret is now sealed under it, and keys after it may be removed.")
