"""PARTNER_OPS_PORT: the operator's endpoints on a port of their own.

When it is set, gunicorn also listens on that port (gunicorn.conf.py; a worker refuses to start if
it does not) and each request is served by the port it arrived on: /healthz, /readyz, /metrics,
/openapi.json and /docs only on the ops port, everything else only on the partner port; the other
port answers 404 problem+json, as for a path that does not exist. So probes and scrapes can come
from the monitoring network to a port of their own, while the partner port stays where only the
reverse proxy reaches it: it is never exposed bare, since a few slow clients hold all of gunicorn's
request threads (deploy/nginx keeps them in nginx). The port is the listening socket's own, never
one a client wrote: behind a unix socket gunicorn takes SERVER_PORT from the Host header.
"""

from functools import partial

from flask import Flask, request
from werkzeug.exceptions import NotFound

OPS_PATHS = frozenset({"/healthz", "/readyz", "/metrics", "/openapi.json", "/docs"})


def install_ops_port(app: Flask) -> None:
    port = app.config["OPS_PORT"]
    if port is not None:
        app.before_request(partial(_keep_apart, port))


def is_ops_path(path: str) -> bool:
    """The operator's paths, and the platform's publish endpoints (/internal/…)."""
    return path in OPS_PATHS or path.startswith(("/docs/", "/internal/"))


def arrival_port(environ: dict) -> int | None:
    """The local port of the connection the request came on (None: a unix socket)."""
    connection = environ.get("gunicorn.socket")
    if connection is None:  # another server (the tests'): the port it listens on
        return int(environ.get("SERVER_PORT") or 0)
    address = connection.getsockname()
    return address[1] if isinstance(address, tuple) else None


def unserved_ops_port(ops_port: int | None, addresses: list) -> str | None:
    """Why a server listening at `addresses` (sockets' names) cannot serve PARTNER_OPS_PORT; None if
    it can: it must listen on the ops port, and on a partner port beside it."""
    if ops_port is None:
        return None
    ports = [address[1] for address in addresses if isinstance(address, tuple)]  # unix sockets: a path
    if ops_port not in ports:
        return (f"PARTNER_OPS_PORT is {ops_port}, but the server does not listen on it: a --bind of your "
                f"own (or a systemd socket unit) must name it too, and gunicorn's -e sets it too late "
                f"(set it in gunicorn's environment)")
    if ports.count(ops_port) == len(addresses):
        return f"PARTNER_OPS_PORT is {ops_port}, the only port the server listens on: the partner API needs its own"
    return None


def _keep_apart(ops_port: int) -> None:
    if is_ops_path(request.path) != (arrival_port(request.environ) == ops_port):
        raise NotFound()
