"""The application factory and the HTTP API: thin routes that parse, call one domain function, shape."""

import functools
import json
import logging

from flask import Blueprint, Flask, current_app, g, request
from playhouse.shortcuts import model_to_dict
from werkzeug.exceptions import NotFound

from delivery import Dispatcher
from partner.config import load_config
from partner.edge.apidocs import install_docs
from partner.edge.auth import authenticate, require_scope
from partner.edge.health import install_health
from partner.edge.ops_port import install_ops_port
from partner.edge.pagination import Cursors, cursor_key, read_page_args
from partner.edge.problems import register_error_handlers
from partner.edge.publish_api import install_publishing
from partner.edge.proxies import ForwardedFromProxies
from partner.edge.ratelimit import RateLimits
from partner.edge.request_ids import install_request_ids
from partner.edge.response_headers import install_response_headers
from partner.edge.json_body import read_json_object
from partner.validation import Field, validate
from partner.keys import IDENTITY_READ, WEBHOOKS_MANAGE
from partner.events import TEST_PING, failures_page, trigger_test_ping
from partner.operator.cli import COMMANDS, refuse_flask_run
from partner.outbound.dns import Lookups
from partner.outbound.transport import Deadline
from partner.startup import refuse
from partner.store.connection import bind, db
from partner.subscriptions import (create_subscription, delete_subscription, find_subscription, list_subscriptions,
                                   secret_of, subscription_fields)
from partner.timestamps import iso, now_ms, to_ms

log = logging.getLogger(__name__)

# How long creating a subscription waits for its host's DNS answer: a name that does not answer
# must not hold a request thread (and every request queued behind it) for the resolver's ~10 s.
CREATE_LOOKUP_SECONDS = 2.0
# The creates' lookups (partner/outbound/dns.py): an organization whose names never answer holds at
# most CREATE_LOOKUPS_PER_ORGANIZATION of these threads, and of a worker's 8 request threads (gunicorn.conf.py)
# at most that many wait on its lookups, and at most CREATE_LOOKUPS_WAITING on every organization's
# together. So two organizations' creates to names that never answer hold 4 request threads: a third's
# creates to names that answer still find a lookup, and its other requests and /healthz a thread; three
# such organizations hold 6, and the 2 left are never taken by a lookup. Beyond, a create is refused at
# once (503, Retry-After).
CREATE_LOOKUP_THREADS, CREATE_LOOKUPS_PER_ORGANIZATION, CREATE_LOOKUPS_WAITING = 32, 2, 6

api = Blueprint("api", __name__, url_prefix="/api/v1/partner")
api.before_request(authenticate)


def create_app(overrides: dict | None = None) -> Flask:
    """Build the app: configuration, extensions, routes, CLI. Opens no file and no connection, and
    starts no thread: partner/startup.py is the start-up step, and the delivery scheduler is started
    by the server's worker hook."""
    refuse_flask_run()
    app = Flask(__name__)
    try:
        load_config(app, overrides)
    except ValueError as error:
        refuse(error, "refusing to start: %s", error)
    if app.config["ALLOWED_NETWORKS"]:
        log.warning("webhook targets in %s are exempt from the internal-address block",
                    ", ".join(map(str, app.config["ALLOWED_NETWORKS"])))
    app.extensions["database"] = bind(app.config["DATABASE_URL"])
    # Read at its first use: building the app opens nothing.
    app.extensions["cursors"] = functools.cache(lambda: Cursors(cursor_key(), app.config["CLOCK"]))
    app.extensions["rate_limits"] = RateLimits(app)
    app.extensions["delivery"] = Dispatcher(app.config)
    app.extensions["lookups"] = Lookups(app.config["RESOLVER"], CREATE_LOOKUP_THREADS, CREATE_LOOKUPS_PER_ORGANIZATION,
                                        CREATE_LOOKUPS_PER_ORGANIZATION, CREATE_LOOKUPS_WAITING)
    install_health(app)  # first: it counts every request, those the hooks below refuse too
    install_request_ids(app)
    install_response_headers(app)
    if app.config["TRUSTED_PROXIES"]:  # else X-Forwarded-* are only text a client wrote
        app.wsgi_app = ForwardedFromProxies(app.wsgi_app, app.config["TRUSTED_PROXIES"],
                                            app.config["TRUSTED_PROXY_NETWORKS"])
    app.before_request(_refuse_doubled_slashes)
    install_ops_port(app)
    app.teardown_request(_close_connection)
    register_error_handlers(app)
    app.register_blueprint(api)
    install_publishing(app)
    install_docs(app)
    for group in COMMANDS:
        app.cli.add_command(group)
    return app


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
        "events": None if row["events"] is None else json.loads(row["events"]),
        "active": bool(row["active"]),  # SQLite answers 0 or 1
        "consecutive_failures": row["consecutive_failures"],
        "auto_disabled_at": iso(row["auto_disabled_at"]),
        "created_at": iso(row["created_at"]),
    }
    if include_secret:
        body["secret"] = row["secret"]
    return body


def page_args(listing: str) -> tuple[int, list | None]:
    """`limit` and the position `cursor` stands for in the caller's organization's `listing`."""
    return read_page_args(request.args, current_app.extensions["cursors"](), g.caller.organization.id, listing)


def page_json(rows, position, listing: str, shape) -> dict:
    cursor = current_app.extensions["cursors"]().issue(g.caller.organization.id, listing, position)
    return {"data": [shape(row) for row in rows], "next_cursor": cursor}


@api.post("/webhooks")
@require_scope(WEBHOOKS_MANAGE)
def create_webhook():
    body = read_json_object()  # before the lookup's deadline starts: a slow client's time is its own
    resolve = current_app.extensions["lookups"].resolver_for(g.caller.organization.id,
                                                              Deadline(CREATE_LOOKUP_SECONDS).remaining)
    fields = validate(body, subscription_fields(resolve, current_app.config["ALLOWED_NETWORKS"]))
    subscription = create_subscription(g.caller.organization.id, fields["url"], fields["description"],
                                       now_ms(current_app.config["CLOCK"]), fields["events"])
    location = f"{api.url_prefix}/webhooks/{subscription.id}"
    row = {**model_to_dict(subscription, recurse=False), "secret": secret_of(subscription)}
    return subscription_json(row, include_secret=True), 201, {"Location": location}


@api.get("/webhooks")
@require_scope(WEBHOOKS_MANAGE)
def list_webhooks():
    limit, position = page_args("subscriptions")
    rows, next_position = list_subscriptions(g.caller.organization.id, position, limit)
    return page_json(rows, next_position, "subscriptions", subscription_json)


@api.delete("/webhooks/<subscription_id>")
@require_scope(WEBHOOKS_MANAGE)
def delete_webhook(subscription_id: str):
    subscription = find_subscription(g.caller.organization.id, subscription_id)
    delete_subscription(subscription, now_ms(current_app.config["CLOCK"]))
    current_app.extensions["delivery"].deleted(subscription.url)
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
        "error_detail": row["error_detail"],
        "response_excerpt": row["response_excerpt"],
        "duration_ms": row["duration_ms"],
        "attempted_at": iso(row["attempted_at"]),
        "next_attempt_at": iso(row["next_attempt_at"]),
    }


@api.get("/webhooks/<subscription_id>/failures")
@require_scope(WEBHOOKS_MANAGE)
def list_failures(subscription_id: str):
    subscription = find_subscription(g.caller.organization.id, subscription_id)
    listing = f"failures:{subscription.id}"
    limit, position = page_args(listing)
    rows, next_position = failures_page(subscription, position, limit)
    return page_json(rows, next_position, listing, failure_json)
