"""The application factory and the HTTP API: thin routes that parse, call one domain function, shape."""

import logging
import os
from typing import NoReturn

import click
from flask import Blueprint, Flask, current_app, g, request
from playhouse.shortcuts import model_to_dict
from werkzeug.exceptions import NotFound
from werkzeug.middleware.proxy_fix import ProxyFix

from delivery import Dispatcher
from models import DatabaseTooOld, db, open_database
from partner import sealing
from partner.availability import database_outage, describe, is_unavailable, open_hint
from partner.backup import hold_serving_lock, sqlite_path
from partner.config import load_config
from partner.database import probe_write
from partner.edge.apidocs import docs
from partner.encryption import check_stored_keys
from partner.errors import StartRefused
from partner.edge.auth import authenticate, require_scope
from partner.edge.health import install_health
from partner.edge.ops_port import install_ops_port
from partner.edge.pagination import cursor_key, encode_cursor, read_page_args
from partner.edge.problems import register_error_handlers
from partner.edge.ratelimit import RateLimits
from partner.edge.request_ids import install_request_ids
from partner.edge.response_headers import install_response_headers
from partner.edge.validation import Field, read_json_object, validate
from partner.keys import IDENTITY_READ, WEBHOOKS_MANAGE
from partner.migrations import SchemaTooNew
from partner.operator.cli import (AS_IT_IS, COMMANDS, NEEDS_KEYS, NEEDS_NOTHING, REPLACES_THE_FILE, only_shows_help,
                                  runs_a_command)
from partner.operator.logs import database_name
from partner.outbound.dns import Lookups
from partner.events import TEST_PING, failures_page, trigger_test_ping
from partner.subscriptions import (create_subscription, delete_subscription, find_subscription, list_subscriptions,
                                   subscription_fields)
from partner.timestamps import iso, now_ms, to_ms

log = logging.getLogger(__name__)

# How long creating a subscription waits for its host's DNS answer: a name that does not answer
# must not hold a request thread (and every request queued behind it) for the resolver's ~10 s.
CREATE_LOOKUP_SECONDS = 2.0

api = Blueprint("api", __name__, url_prefix="/api/v1/partner")


def create_app(overrides: dict | None = None) -> Flask:
    """Build the app: configuration, database (schema applied), rate limits, routes, CLI.
    Starts no thread: the delivery scheduler is started by the server's worker hook."""
    app = Flask(__name__)
    try:
        load_config(app, overrides)
        dispatcher = Dispatcher(app.config)  # loads PARTNER_DELIVERY_CA_BUNDLE
    except ValueError as error:
        _refuse(error, "refusing to start: %s", error)
    if app.config["ALLOWED_NETWORKS"]:
        log.warning("webhook targets in %s are exempt from the internal-address block",
                    ", ".join(map(str, app.config["ALLOWED_NETWORKS"])))
    _open_storage(app)
    app.extensions["rate_limits"] = RateLimits(app)
    app.extensions["delivery"] = dispatcher
    lookups = Lookups(app.config["RESOLVER"], threads=8)
    app.extensions["subscription_fields"] = subscription_fields(
        lookups.within(CREATE_LOOKUP_SECONDS), app.config["ALLOWED_NETWORKS"])
    install_health(app)  # first: it counts every request, those the hooks below refuse too
    install_request_ids(app)
    install_response_headers(app)
    _trust_proxies(app, app.config["TRUSTED_PROXIES"])
    app.before_request(_refuse_doubled_slashes)
    install_ops_port(app)
    app.teardown_request(_close_connection)
    register_error_handlers(app)
    app.register_blueprint(api)
    app.register_blueprint(docs)
    for group in COMMANDS:
        app.cli.add_command(group)
    # No connection outlives start-up: with gunicorn --preload this process forks the workers, and an
    # SQLite connection must never be used on both sides of a fork.
    if "database" in app.extensions:  # not opened for `flask encryption new-key`, nor for help
        db.close_idle()
    return app


def _open_storage(app: Flask) -> None:
    """The keys and the database, as this process needs them: a service (or an operator's command)
    migrates the database and refuses what it cannot serve; a schema command takes the database as
    it is, with keys only if it may open a secret; `flask encryption new-key` and help need neither."""
    if runs_a_command(NEEDS_NOTHING) or only_shows_help():
        return
    url = app.config["DATABASE_URL"]
    if runs_a_command(AS_IT_IS):  # it reads or changes the database as it is, and serves nothing
        _refuse_a_missing_file(url)
        if runs_a_command(NEEDS_KEYS):
            _load_keys(app)
        app.extensions["database"] = _open_database(url, migrate=False)
        return
    _load_keys(app)
    if url.startswith("sqlite"):  # `flask db restore` refuses while held
        hold_serving_lock(sqlite_path(url))
    app.extensions["database"] = _open_database(url, migrate=True)
    _say_if_the_database_cannot_write(app)
    with db.connection_context():
        _refuse_unknown_keys(app)
        app.extensions["cursor_key"] = cursor_key()


def _refuse_a_missing_file(url: str) -> None:
    # Opening it would make an empty database, which a mistyped path would then back up or report
    # on as if it were the real one.
    if url.startswith("sqlite") and not runs_a_command(REPLACES_THE_FILE) and not os.path.exists(sqlite_path(url)):
        _refuse(FileNotFoundError(sqlite_path(url)), "no database at %s: a service makes a new one at its "
                "first start", sqlite_path(url))


def _open_database(url: str, migrate: bool):
    """open_database, saying in one line which database could not be opened (or is too new) and why."""
    try:
        return open_database(url, migrate)
    except (SchemaTooNew, DatabaseTooOld) as error:
        _refuse(error, "database %s refused: %s", database_name(url), error)
    except Exception as error:
        if is_unavailable(error):
            _refuse(error, "database %s cannot be opened (%s): the service cannot start until it can (%s)",
                    database_name(url), describe(error), open_hint(url))
        raise


def _refuse(error: Exception, message: str, *args) -> NoReturn:
    """Say in one line why the service cannot start. A `flask` command then exits 1 without a
    traceback (the line says it all); elsewhere StartRefused is raised (wsgi.py: gunicorn stops)."""
    log.error(message, *args)
    if click.get_current_context(silent=True) is not None:
        raise click.exceptions.Exit(1) from error
    raise StartRefused(message % args) from error


def _load_keys(app: Flask) -> None:
    """The keys that seal webhook secrets; a setting that cannot be used is refused in one line."""
    url = app.config["DATABASE_URL"]
    key_file = app.config["ENCRYPTION_KEY_FILE"] or os.path.join(app.instance_path, "encryption.key")
    try:
        sealing.use(sealing.load_keyring(app.config["ENCRYPTION_KEYS"], key_file, url.startswith("sqlite")))
    except sealing.SealingError as error:
        _refuse(error, "refusing to start: %s", error)


def _refuse_unknown_keys(app: Flask) -> None:
    try:
        check_stored_keys()
    except sealing.SealingError as error:
        _refuse(error, "database %s refused: %s", database_name(app.config["DATABASE_URL"]), error)


def _say_if_the_database_cannot_write(app: Flask) -> None:
    # The process still starts: reads, /healthz and /readyz (not ready) must answer, and writes
    # succeed again by themselves once the database takes them.
    try:
        with db.connection_context():
            probe_write()
    except Exception as error:  # noqa: BLE001 - sorted by is_unavailable, the rest re-raised
        if not is_unavailable(error):
            raise
        database_outage.failed(error)  # /readyz says not ready until a write commits
        log.error("database %s cannot take a write now (%s): API writes answer 503 and /readyz reports "
                  "not ready until it can", database_name(app.config["DATABASE_URL"]), describe(error))


def _trust_proxies(app: Flask, hops: int) -> None:
    # The client address (the failed-authentication budget's key) and scheme as the last `hops`
    # proxies saw them; with none, X-Forwarded-* are only text a client wrote.
    if hops:
        app.wsgi_app = ProxyFix(app.wsgi_app, x_for=hops, x_proto=hops)


def _refuse_doubled_slashes() -> None:
    # Werkzeug would answer `/a//b` with a 308 HTML redirect to `/a/b` and serve `//a` as `/a`;
    # a path with an empty segment names no resource: 404 problem+json, before authentication.
    if "//" in request.environ.get("PATH_INFO", ""):
        raise NotFound()


def _close_connection(_error=None) -> None:
    # A request takes a pooled connection at its first query (peewee connects on demand), and
    # some take none (a 404, a malformed key).
    if not db.is_closed():
        db.close()


@api.before_request
def _authenticate() -> None:
    authenticate()


@api.after_request
def _rate_limit_headers(response):
    if "rate_window" in g:
        response.headers.extend(g.rate_window.headers())
    return response


# --- identity ---------------------------------------------------------------------------------

@api.get("/me")
@require_scope(IDENTITY_READ)
def me():
    caller, window = g.caller, g.rate_window
    return {
        "organization": caller.organization.slug,
        "key_id": caller.key_id,
        "scopes": sorted(caller.scope_set),
        "rate_limit_per_minute": caller.organization.rate_limit_per_minute,
        "rate_limit_remaining": window.remaining,
        "rate_limit_reset_at": iso(to_ms(window.reset_at)),
    }


# --- webhook subscriptions ----------------------------------------------------------------------

def subscription_json(row: dict, include_secret: bool = False) -> dict:
    """A subscription's fields (a row by field name) as the API shows them."""
    body = {
        "id": row["id"],
        "url": row["url"],
        "description": row["description"],
        "active": bool(row["active"]),  # SQLite answers 0 or 1
        "consecutive_failures": row["consecutive_failures"],
        "auto_disabled_at": iso(row["auto_disabled_at"]),
        "created_at": iso(row["created_at"]),
    }
    if include_secret:
        body["secret"] = row["secret"]
    return body


def page_json(rows, position, scope: str, shape) -> dict:
    key = current_app.extensions["cursor_key"]
    return {"data": [shape(row) for row in rows], "next_cursor": encode_cursor(key, scope, position)}


@api.post("/webhooks")
@require_scope(WEBHOOKS_MANAGE)
def create_webhook():
    fields = validate(read_json_object(), current_app.extensions["subscription_fields"])
    subscription = create_subscription(g.caller.organization.id, fields["url"], fields["description"],
                                       now_ms(current_app.config["CLOCK"]))
    location = f"{api.url_prefix}/webhooks/{subscription.id}"
    row = {**model_to_dict(subscription, recurse=False), "secret": subscription.secret}
    return subscription_json(row, include_secret=True), 201, {"Location": location}


@api.get("/webhooks")
@require_scope(WEBHOOKS_MANAGE)
def list_webhooks():
    org_id = g.caller.organization.id
    scope = f"subscriptions:{org_id}"
    limit, position = read_page_args(request.args, current_app.extensions["cursor_key"], scope)
    rows, next_position = list_subscriptions(org_id, position, limit)
    return page_json(rows, next_position, scope, subscription_json)


@api.delete("/webhooks/<subscription_id>")
@require_scope(WEBHOOKS_MANAGE)
def delete_webhook(subscription_id: str):
    delete_subscription(find_subscription(g.caller.organization.id, subscription_id),
                        now_ms(current_app.config["CLOCK"]))
    current_app.extensions["delivery"].purge_soon()
    return "", 204


# --- deliveries ---------------------------------------------------------------------------------

TEST_FIELDS = (Field("secret", required=True, max_length=256),)


@api.post("/webhooks/<subscription_id>/test")
@require_scope(WEBHOOKS_MANAGE)
def test_webhook(subscription_id: str):
    # The resource (404) before the body, as documented; trigger_test_ping finds it again, held, after
    # the body is read: a slow client must not hold a write transaction open.
    find_subscription(g.caller.organization.id, subscription_id)
    secret = validate(read_json_object(), TEST_FIELDS)["secret"]
    event = trigger_test_ping(g.caller.organization.id, subscription_id, secret, g.caller.key_id,
                              now_ms(current_app.config["CLOCK"]))
    current_app.extensions["delivery"].wake()
    return {"id": event.id, "event": TEST_PING, "subscription_id": subscription_id,
            "status": "queued"}, 202


def failure_json(row: dict) -> dict:
    """A failure record (a row by field name, with its event's `kind`) as the API shows it."""
    return {
        "id": row["id"],
        "event_id": row["event"],
        "event": row["kind"],
        "attempt": row["attempt"],
        "http_status": row["http_status"],
        "error": row["error"],
        "response_excerpt": row["response_excerpt"],
        "duration_ms": row["duration_ms"],
        "attempted_at": iso(row["attempted_at"]),
        "next_attempt_at": iso(row["next_attempt_at"]),
    }


@api.get("/webhooks/<subscription_id>/failures")
@require_scope(WEBHOOKS_MANAGE)
def list_failures(subscription_id: str):
    subscription = find_subscription(g.caller.organization.id, subscription_id)
    scope = f"failures:{subscription.id}"
    limit, position = read_page_args(request.args, current_app.extensions["cursor_key"], scope)
    rows, next_position = failures_page(subscription, position, limit)
    return page_json(rows, next_position, scope, failure_json)
