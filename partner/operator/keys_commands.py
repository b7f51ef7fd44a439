"""`flask keys` and `flask orgs`: partner API keys (they have no HTTP endpoint) and organizations'
rate limits. Thin: parse, call one domain function, print."""

import click
from flask.cli import AppGroup

from partner.keys import (DEFAULT_RATE_LIMIT, GRANTABLE_SCOPES, MAX_RATE_LIMIT, IssuedKey, create_key, list_keys,
                          revoke_key, rotate_key)
from partner.operator.commands import now, run, starts, table
from partner.organizations import list_organizations, set_rate_limit
from partner.startup import UP_TO_DATE
from partner.timestamps import iso

keys_cli = AppGroup("keys", help="Issue, list, revoke and rotate partner API keys.")


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
    _announce(run(create_key, org, list(scopes), now(), rate_limit))


@keys_cli.command("list")
@click.option("--org", help="Only this organization's keys.")
@starts(UP_TO_DATE)
def list_command(org: str | None) -> None:
    """List keys (never their secrets)."""
    table(("KEY_ID", "ORG", "SCOPES", "RATE_LIMIT", "CREATED_AT", "REVOKED_AT"),
          ((key.key_id, key.organization.slug, ",".join(sorted(key.scope_set)), key.organization.rate_limit_per_minute,
            iso(key.created_at), iso(key.revoked_at)) for key in run(list_keys, org)))


@keys_cli.command("revoke")
@click.argument("key_id")
@starts(UP_TO_DATE)
def revoke_command(key_id: str) -> None:
    """Revoke a key at once; every later request with it gets 401."""
    key = run(revoke_key, key_id, now())
    if key is None:
        raise click.ClickException(f"No key {key_id!r}.")
    click.echo(f"Key {key_id} revoked at {iso(key.revoked_at)}.")


@keys_cli.command("rotate")
@click.argument("key_id")
@starts(UP_TO_DATE)
def rotate_command(key_id: str) -> None:
    """Create a key with the same organization, scopes and limit, and revoke the old one."""
    issued = run(rotate_key, key_id, now())
    if issued is None:
        raise click.ClickException(f"No active key {key_id!r}.")
    click.echo(f"Key {key_id} revoked.", err=True)
    _announce(issued)


orgs_cli = AppGroup("orgs", help="Organizations: their rate limits, keys, subscriptions and deliveries.")


@orgs_cli.command("list")
@starts(UP_TO_DATE)
def orgs_list() -> None:
    """List organizations: limit, active keys, subscriptions, open and dead deliveries."""
    table(("SLUG", "RATE_LIMIT_PER_MINUTE", "ACTIVE_KEYS", "SUBSCRIPTIONS", "PENDING", "DEAD"),
          (org.row() for org in run(list_organizations)))


@orgs_cli.command("set-limit")
@click.argument("slug")
@click.argument("per_minute", type=click.IntRange(1, MAX_RATE_LIMIT))
@starts(UP_TO_DATE)
def orgs_set_limit(slug: str, per_minute: int) -> None:
    """Set the organization's requests per minute, shared by all its keys, from their next request."""
    run(set_rate_limit, slug, per_minute)
    click.echo(f"Organization {slug} now has {per_minute} requests per minute, for every key.")
