"""Configuration: the `PARTNER_*` variables (docs/operations.md), their defaults, and a check at start-up."""

import difflib
import logging
import os
import time

from flask import Flask

from partner.telemetry.logs import FORMATS
from partner.outbound import ssrf

# PARTNER_RETENTION_DAYS at most: a century. Any age past it is "keep everything", and the cutoff stays
# a time a datetime can show.
MAX_DAYS = 36_500

DEFAULTS = {
    "DATABASE_URL": "sqlite:///instance/partner.sqlite3",
    "RATELIMIT_STORAGE_URI": "memory://",
    "RATELIMIT_STORAGE_TIMEOUT": 0.5,
    "WEBHOOK_ALLOWED_NETWORKS": [],
    "DELIVERY_RETRY_DELAYS": [60, 300, 1800, 7200, 21600, 86400],
    "DELIVERY_TIMEOUT": 10,
    "DELIVERY_POLL_INTERVAL": 2,
    # Many slots, because an attempt to a hanging endpoint holds one until the deadline; subscriptions
    # whose last attempt failed may hold only half of them (delivery.py): the rest stay for healthy ones.
    # And a slot is held for the receiver's whole answer time: at 64, receivers answering in 200 ms
    # drained at most 320 a second; 256 (bench/engine_cpu, docs/performance.md) keeps the attempts in
    # flight, at most twice this, inside the descriptor budget systemd's default limit leaves (512).
    "DELIVERY_CONCURRENCY": 256,
    # The most attempts in flight to one subscription, in every process; each adapts between 1 and this
    # to its receiver (partner/concurrency.py).
    "DELIVERY_MAX_PER_SUBSCRIPTION": 16,
    "AUTO_DISABLE_THRESHOLD": 20,
    # Open deliveries an organization may have before its publishes are refused (503 backlog_full).
    "BACKLOG_LIMIT": 100_000,
    "SCHEDULER_ENABLED": True,
    "DELIVERY_CA_BUNDLE": "",
    "RETENTION_DAYS": 30,
    "LOG_FORMAT": "text",  # applied by gunicorn.conf.py (logs.py); checked here too
    "LOG_LEVEL": "INFO",  # the same
    "AUTH_FAILURE_RATE_LIMIT": 60,
    "MAX_CONTENT_LENGTH": 64 * 1024,
    # Reverse-proxy hops whose X-Forwarded-For / -Proto are believed (docs/deploying.md). 0: a client can
    # never choose the address its failed authentications are counted against.
    "TRUSTED_PROXIES": 0,
    # ...and only from a peer in these networks (edge/proxies.py): loopback, where the kit's nginx is.
    "TRUSTED_PROXY_ADDRESSES": ["127.0.0.1/32", "::1/128"],
    # A second port for /healthz, /readyz, /metrics, /openapi.json and /docs (edge/ops_port.py); unset:
    # they answer on the partner port.
    "OPS_PORT": None,
    "ENCRYPTION_KEYS": None,  # unset: a key file on SQLite (ENCRYPTION_KEY_FILE), refused on PostgreSQL
    "ENCRYPTION_KEY_FILE": "",  # empty: encryption.key in the instance folder
    # Seams for tests: the wall clock (Unix seconds) and the DNS resolver (SEAMS).
    "CLOCK": time.time,
    "RESOLVER": ssrf.system_resolver,
}
SEAMS = ("CLOCK", "RESOLVER")  # set only through create_app's overrides, never from the environment

_POSITIVE_NUMBERS = ("DELIVERY_TIMEOUT", "DELIVERY_POLL_INTERVAL", "RATELIMIT_STORAGE_TIMEOUT")
_POSITIVE_INTEGERS = ("DELIVERY_CONCURRENCY", "DELIVERY_MAX_PER_SUBSCRIPTION", "AUTO_DISABLE_THRESHOLD", "BACKLOG_LIMIT",
                      "AUTH_FAILURE_RATE_LIMIT", "RETENTION_DAYS", "MAX_CONTENT_LENGTH")
_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
PREFIX = "PARTNER_"

log = logging.getLogger(__name__)


def load_config(app: Flask, overrides: dict | None) -> None:
    """Defaults, then PARTNER_* from the environment, then `overrides`; raise ValueError if unusable."""
    app.config.update(DEFAULTS)
    warn_of_unknown_variables(os.environ)
    app.config.from_prefixed_env(PREFIX.rstrip("_"))
    app.config.update({name: DEFAULTS[name] for name in SEAMS})  # never from the environment
    app.config.update(overrides or {})
    check_config(app.config)
    app.config["ALLOWED_NETWORKS"] = _networks(app.config, "WEBHOOK_ALLOWED_NETWORKS")
    app.config["TRUSTED_PROXY_NETWORKS"] = _networks(app.config, "TRUSTED_PROXY_ADDRESSES")


def check_config(config) -> None:
    for name in _POSITIVE_NUMBERS:
        _require(name, _is_number(config[name]) and config[name] > 0, "a positive number")
    for name in _POSITIVE_INTEGERS:
        _require(name, _is_integer(config[name]) and config[name] > 0, "a positive integer")
    _require("RETENTION_DAYS", config["RETENTION_DAYS"] <= MAX_DAYS, f"at most {MAX_DAYS} (a century)")
    _require("TRUSTED_PROXIES", _is_integer(config["TRUSTED_PROXIES"]) and config["TRUSTED_PROXIES"] >= 0,
             "a whole number of proxy hops, 0 or more")
    ops_port = config["OPS_PORT"]
    _require("OPS_PORT", ops_port is None or is_port(ops_port), "a TCP port number, 1 to 65535")
    delays = config["DELIVERY_RETRY_DELAYS"]
    _require("DELIVERY_RETRY_DELAYS", isinstance(delays, list)
             and all(_is_number(d) and d >= 0 for d in delays), "a JSON list of seconds")
    _require("SCHEDULER_ENABLED", isinstance(config["SCHEDULER_ENABLED"], bool), "true or false")
    _require("WEBHOOK_ALLOWED_NETWORKS", isinstance(config["WEBHOOK_ALLOWED_NETWORKS"], list),
             'a JSON list of CIDRs, e.g. ["127.0.0.0/8"]')
    bundle = config["DELIVERY_CA_BUNDLE"]
    _require("DELIVERY_CA_BUNDLE", isinstance(bundle, str) and (not bundle or os.path.isfile(bundle)),
             "empty (the default trust store) or the path of a PEM file of CA certificates")
    _require("LOG_FORMAT", config["LOG_FORMAT"] in FORMATS, " or ".join(FORMATS))
    _require("LOG_LEVEL", config["LOG_LEVEL"] in _LOG_LEVELS, ", ".join(_LOG_LEVELS))
    for name in ("DATABASE_URL", "RATELIMIT_STORAGE_URI"):
        _require(name, isinstance(config[name], str) and "://" in config[name], "a URL")


def separate_budgets(storage_uri: str, workers: int) -> str | None:
    """What an operator must hear at start-up when `workers` processes each count rate limits in
    their own memory (each grants the whole budget again); None when they share a storage."""
    if workers <= 1 or not storage_uri.startswith("memory://"):
        return None
    return (f"{workers} workers each count rate limits in their own memory (PARTNER_RATELIMIT_STORAGE_URI="
            f"{storage_uri}): an organization gets up to {workers} times its limit, and a client {workers} "
            f"times its failed-authentication budget; set PARTNER_RATELIMIT_STORAGE_URI=redis://... to share them")


def _networks(config, name: str) -> tuple:
    try:
        return ssrf.parse_networks(config[name])
    except ValueError as error:
        raise ValueError(f"PARTNER_{name}: {error}") from None


def warn_of_unknown_variables(environ) -> None:
    """One WARNING for each PARTNER_* variable the service does not read, naming the closest one it
    does: a mistyped name would otherwise be ignored in silence, and its default used."""
    known = [PREFIX + name for name in DEFAULTS if name not in SEAMS]
    for name in sorted(environ):
        if not name.startswith(PREFIX) or name in known:
            continue
        if name.removeprefix(PREFIX) in SEAMS:
            log.warning("%s is ignored: it is a seam for tests, never read from the environment", name)
            continue
        closest = difflib.get_close_matches(name, known, n=1)
        log.warning("%s is not a setting of this service and is ignored%s", name,
                    f"; did you mean {closest[0]}?" if closest else " (docs/operations.md lists the settings)")


def _require(name: str, ok: bool, expected: str) -> None:
    if not ok:
        raise ValueError(f"PARTNER_{name} must be {expected}")


def is_port(value) -> bool:
    return _is_integer(value) and 1 <= value <= 65535


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_integer(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
