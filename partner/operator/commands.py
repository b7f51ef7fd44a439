"""What every `flask` command shares: its start-up declaration, running one domain operation with
its refusal as a one-line exit 1, and the tables and times it reads and prints."""

import functools

import click
from flask import current_app

from partner.errors import OperatorError, ValidationError
from partner.safe_text import printable
from partner.startup import start_command
from partner.store.availability import describe, is_unavailable
from partner.store.connection import db
from partner.timestamps import now_ms, parse_rfc3339


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


def now() -> int:
    return now_ms(current_app.config["CLOCK"])


def table(header: tuple, rows) -> None:
    """Tab-separated rows; a cell's text from outside (a receiver's answer, a partner's label) printed
    with its control and bidi characters escaped, as the logs print it (safe_text.printable)."""
    click.echo("\t".join(header))
    for row in rows:
        click.echo("\t".join("-" if cell is None else printable(str(cell)) for cell in row))


def run(operation, *args, **kwargs):
    """Run a domain operation on a connection; its refusal exits 1 with the message."""
    with db.connection_context():
        return unless_refused(operation, *args, **kwargs)


def unless_refused(operation, *args, **kwargs):
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


class Rfc3339(click.ParamType):
    """An RFC 3339 time with its offset (`2026-11-22T10:15:30Z`), as Unix milliseconds."""
    name = "RFC3339"

    def convert(self, value, param, ctx):
        moment = parse_rfc3339(value)
        if moment is None:
            self.fail(f"{value!r} is not an RFC 3339 time with an offset, e.g. 2026-11-22T10:15:30Z",
                      param, ctx)
        return moment
