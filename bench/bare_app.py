"""The yardstick of api_overhead: a bare Flask app with one JSON route and nothing else.

Served by the repo's gunicorn.conf.py like the service (`gunicorn bench.bare_app:app`), so both
have the same worker class, threads and access log. Its post_worker_init hook reads the `OPS_PORT`
setting and starts `extensions["delivery"]`, hence no ops port and a stand-in that does nothing.
"""

from flask import Flask


class _NoDelivery:
    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass


app = Flask(__name__)
app.config["OPS_PORT"] = None
app.extensions["delivery"] = _NoDelivery()


@app.get("/bare")
def bare():
    return {"organization": "bench", "key_id": "Q3k9bench0000000000", "scopes": ["identity:read"],
            "rate_limit_per_minute": 600, "rate_limit_remaining": 599,
            "rate_limit_reset_at": "2026-11-22T10:15:30.123Z"}
