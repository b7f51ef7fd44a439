"""The operator CLI: every `flask` command group, as `create_app` registers them, and the refusal of
Flask's own `flask run`."""

import click
from flask.cli import run_command

from partner.operator.db_commands import db_cli, encryption_cli
from partner.operator.keys_commands import keys_cli, orgs_cli
from partner.operator.publish_commands import event_types_cli, events_cli, publishers_cli
from partner.operator.webhook_commands import deliveries_cli, webhooks_cli

COMMANDS = (keys_cli, orgs_cli, webhooks_cli, deliveries_cli, db_cli, encryption_cli, publishers_cli,
            event_types_cli, events_cli)


def refuse_flask_run() -> None:
    """Refuse, in one line, to be loaded by `flask run`: it would serve without the start-up step
    (gunicorn.conf.py's hooks migrate, load each worker's keys and start its delivery scanner).
    Flask finds its own commands before an app's, so `run` cannot be replaced, only refused here."""
    context = click.get_current_context(silent=True)
    if context is not None and context.command is run_command:
        raise click.ClickException("`flask run` serves without the service's start-up step (migrations, keys, "
                                   "deliveries): serve with `make run` (gunicorn) instead")
