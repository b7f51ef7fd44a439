"""The yardstick of api_overhead: a bare Flask app with one JSON route and nothing else.

Served by the repo's gunicorn.conf.py like the service (`gunicorn bench.bare_app:app`), so both
have the same worker class, threads and access log. Its post_worker_init hook runs the service's
worker start-up (partner/startup.py `start_worker`: the settings, the sealing keys, the delivery
transport) and starts `extensions["delivery"]`, hence the service's settings and a stand-in that
delivers nothing.
"""

from types import SimpleNamespace

from flask import Flask

from partner.config import load_config


class _NoDelivery:
    courier = SimpleNamespace(sender=None)  # what the worker start-up builds, to refuse a bad CA bundle

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass


app = Flask(__name__)
load_config(app, None)
app.extensions["delivery"] = _NoDelivery()


@app.get("/bare")
def bare():
    return {"organization": "bench", "key_id": "Q3k9bench0000000000", "scopes": ["identity:read"],
            "rate_limit_per_minute": 600, "rate_limit_remaining": 599,
            "rate_limit_reset_at": "2026-11-22T10:15:30.123Z"}
