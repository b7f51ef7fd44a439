"""The operator CLI: every `flask` command group, as `create_app` registers them."""

from partner.operator.db_commands import db_cli, encryption_cli
from partner.operator.keys_commands import keys_cli, orgs_cli
from partner.operator.publish_commands import event_types_cli, events_cli, publishers_cli
from partner.operator.webhook_commands import deliveries_cli, webhooks_cli

COMMANDS = (keys_cli, orgs_cli, webhooks_cli, deliveries_cli, db_cli, encryption_cli, publishers_cli,
            event_types_cli, events_cli)
