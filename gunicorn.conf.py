"""gunicorn settings, read automatically from the repo root: `gunicorn wsgi:app`."""

import ctypes
import glob
import os
import shutil
import sys
import tempfile

from flask import Config

from partner.config import DEFAULTS, is_port
from partner.edge.ops_port import unserved_ops_port
from partner.errors import APP_LOAD_ERROR, StartRefused
from partner.telemetry.logs import ACCESS_FORMAT, GunicornLogger, logging_config

wsgi_app = "wsgi:app"


def _setting(name: str):
    """PARTNER_<name> as the app reads it (Flask's from_prefixed_env), or its default."""
    settings = Config(os.getcwd())
    settings.from_prefixed_env("PARTNER")
    return settings.get(name, DEFAULTS.get(name))


def _ops_port() -> int | None:
    """PARTNER_OPS_PORT; a value that is not a port is the app's to refuse, naming it."""
    port = _setting("OPS_PORT")
    return port if is_port(port) else None


# The partner port, and PARTNER_OPS_PORT beside it (partner/edge/ops_port.py). Set here, so that a
# reload (SIGHUP) reads the same list and keeps its sockets. A --bind on the command line replaces
# the list and must name the ops port too: a worker refuses to start otherwise (post_worker_init).
PARTNER_PORT, OPS_PORT = os.environ.get("PORT", "8000"), _ops_port()
bind = [f"127.0.0.1:{PARTNER_PORT}"]
if OPS_PORT and str(OPS_PORT) != PARTNER_PORT:  # the same port twice: the worker refuses it, naming it
    bind.append(f"127.0.0.1:{OPS_PORT}")
worker_class = "gthread"
workers = 1
threads = 8
# gunicorn 27's control socket lives in ~/.gunicorn and would be shared by every instance on the host.
control_socket_disable = True
# Path only (%(U)s), never the query string, so nothing a client puts in a URL reaches the log.
accesslog = "-"
access_log_format = ACCESS_FORMAT
# Client text in our lines is escaped and bounded (partner/telemetry/logs.py).
logger_class = GunicornLogger
logconfig_dict = logging_config(os.environ.get("PARTNER_LOG_FORMAT", "text"),
                                os.environ.get("PARTNER_LOG_LEVEL", "INFO"))

METRICS_DIR = "PROMETHEUS_MULTIPROC_DIR"
# The workers' metrics need a directory before anything imports prometheus_client, which decides at
# import whether values live in files (summed across workers) or in the process. This file is read
# before the app is loaded, also with --preload, where the master imports the app: so here, not in
# a server hook. A fresh directory per start, unless the operator names one.
if not os.environ.get(METRICS_DIR):
    os.environ[METRICS_DIR] = MADE_METRICS_DIR = tempfile.mkdtemp(prefix="partner-metrics-")


def on_starting(server):
    """Once per service start (not per reload), in the master before any worker forks: empty the
    metrics directory of a previous run's counts, then the start-up step (partner/startup.py) on an
    app of its own. A refusal has been said in one line: the master stops, before binding a port."""
    for stale in glob.glob(os.path.join(os.environ[METRICS_DIR], "*.db")):
        os.remove(stale)
    # Only now: importing the app imports prometheus_client, which reads the directory's setting.
    from app import create_app
    from partner.startup import start_service
    try:
        start_service(create_app(), workers=server.cfg.workers)
    except StartRefused:
        sys.exit(APP_LOAD_ERROR)


def on_exit(server):
    made = globals().get("MADE_METRICS_DIR")
    if made:
        shutil.rmtree(made, ignore_errors=True)


# glibc's mallopt parameter number for the most malloc arenas a process may have.
M_ARENA_MAX = -8


def post_fork(server, worker):
    """Two malloc arenas in the worker, set before it starts a thread. glibc gives threads their
    own arenas, up to 8 per core, and keeps what is freed in each: with 64 delivery threads the
    worker's RSS grew for many minutes under steady load (bench/soak.py). No-op without glibc."""
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is not None:
        mallopt(M_ARENA_MAX, 2)


def post_worker_init(worker):
    """Refuse an ops port this server does not serve; then load this worker's keys and start its
    delivery scanner (never in the master: workers could not reach it)."""
    from partner.startup import start_worker  # the app's modules are the worker's to import
    refusal = unserved_ops_port(worker.wsgi.config["OPS_PORT"], [listener.getsockname() for listener in worker.sockets])
    if refusal:
        worker.log.error("refusing to start: %s", refusal)
        sys.exit(APP_LOAD_ERROR)
    try:
        start_worker(worker.wsgi)
    except StartRefused:
        sys.exit(APP_LOAD_ERROR)
    worker.wsgi.extensions["delivery"].start()


def worker_exit(server, worker):
    """Stop the scanner cleanly; unfinished attempts are retried once their lease expires."""
    dispatcher = getattr(worker, "wsgi", None) and worker.wsgi.extensions.get("delivery")
    if dispatcher:
        dispatcher.stop()


def child_exit(server, worker):
    """A dead worker's gauges leave the scrape; its counters stay counted."""
    from prometheus_client import multiprocess  # only now: the directory is set
    multiprocess.mark_process_dead(worker.pid)
