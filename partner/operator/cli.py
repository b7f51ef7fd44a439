"""The operator CLI: `flask keys create|list|revoke|rotate`. Keys have no HTTP endpoint."""

import click
from flask import current_app
from flask.cli import AppGroup

from errors import ValidationError
from keys import IssuedKey, create_key, list_keys, revoke_key, rotate_key
from models import db
from timestamps import iso, now_ms

keys_cli = AppGroup("keys", help="Issue, list, revoke and rotate partner API keys.")


def _announce(issued: IssuedKey) -> None:
    """Describe the key on stderr and print the full key alone on stdout's last line."""
    key = issued.key
    click.echo(f"Created key {key.key_id} for organization {key.organization.slug} "
               f"with scopes {key.scopes}. The full key is shown once:", err=True)
    click.echo(issued.full_key)


@keys_cli.command("create")
@click.option("--org", required=True, help="Organization slug; created on first use.")
@click.option("--scope", "scopes", multiple=True, help="A scope to grant (repeatable).")
@click.option("--rate-limit", type=click.IntRange(min=1), help="Requests per minute for the organization.")
def create_command(org: str, scopes: tuple[str, ...], rate_limit: int | None) -> None:
    """Create a key; identity:read is always granted."""
    with db.connection_context():
        try:
            issued = create_key(org, list(scopes), now_ms(current_app.config["CLOCK"]), rate_limit)
        except ValidationError as error:
            raise click.ClickException(" ".join(e["message"] for e in error.errors)) from None
    _announce(issued)


@keys_cli.command("list")
@click.option("--org", help="Only this organization's keys.")
def list_command(org: str | None) -> None:
    """List keys (never their secrets)."""
    with db.connection_context():
        keys = list_keys(org)
    click.echo("KEY_ID\tORG\tSCOPES\tRATE_LIMIT\tCREATED_AT\tREVOKED_AT")
    for key in keys:
        click.echo("\t".join([key.key_id, key.organization.slug, ",".join(sorted(key.scope_set)),
                              str(key.organization.rate_limit_per_minute), iso(key.created_at),
                              iso(key.revoked_at) or "-"]))


@keys_cli.command("revoke")
@click.argument("key_id")
def revoke_command(key_id: str) -> None:
    """Revoke a key at once; every later request with it gets 401."""
    with db.connection_context():
        key = revoke_key(key_id, now_ms(current_app.config["CLOCK"]))
    if key is None:
        raise click.ClickException(f"No key {key_id!r}.")
    click.echo(f"Key {key_id} revoked at {iso(key.revoked_at)}.")


@keys_cli.command("rotate")
@click.argument("key_id")
def rotate_command(key_id: str) -> None:
    """Create a key with the same organization, scopes and limit, and revoke the old one."""
    with db.connection_context():
        issued = rotate_key(key_id, now_ms(current_app.config["CLOCK"]))
    if issued is None:
        raise click.ClickException(f"No active key {key_id!r}.")
    click.echo(f"Key {key_id} revoked.", err=True)
    _announce(issued)
