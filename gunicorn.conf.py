"""gunicorn settings, read automatically from the repo root: `gunicorn wsgi:app`."""

import ctypes
import glob
import os
import shutil
import tempfile

from partner.config import is_port
from partner.operator.logs import ACCESS_FORMAT, GunicornLogger, logging_config

wsgi_app = "wsgi:app"
bind = f"127.0.0.1:{os.environ.get('PORT', '8000')}"
worker_class = "gthread"
workers = 1
threads = 8
# gunicorn 27's control socket lives in ~/.gunicorn and would be shared by every instance on the host.
control_socket_disable = True
# Path only (%(U)s), never the query string, so nothing a client puts in a URL reaches the log.
accesslog = "-"
access_log_format = ACCESS_FORMAT
# Client text in our lines is escaped and bounded (partner/operator/logs.py).
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
    """Empty the metrics directory of a previous run's counts (once per start, not per reload), and
    listen on PARTNER_OPS_PORT too (partner/edge/ops_port.py). Here, not in `bind`, so that the port
    is added to whatever addresses the command line gives."""
    for stale in glob.glob(os.path.join(os.environ[METRICS_DIR], "*.db")):
        os.remove(stale)
    ops_port = os.environ.get("PARTNER_OPS_PORT", "")
    if ops_port.isdecimal() and is_port(int(ops_port)):  # else the app's configuration check refuses it
        server.cfg.set("bind", [*server.cfg.bind, f"{_host_of(server.cfg.bind)}:{int(ops_port)}"])


def _host_of(addresses: list[str]) -> str:
    """The host of the first TCP address (the ops port listens beside the partner port), else loopback."""
    for address in addresses:
        if not address.startswith(("unix:", "fd://")) and ":" in address:
            return address.rsplit(":", 1)[0]
    return "127.0.0.1"


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
    """Start this worker's delivery scanner (never in the master: workers could not reach it)."""
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
