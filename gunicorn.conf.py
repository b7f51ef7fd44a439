"""gunicorn settings, read automatically from the repo root: `gunicorn wsgi:app`."""

import os

wsgi_app = "wsgi:app"
bind = f"127.0.0.1:{os.environ.get('PORT', '8000')}"
worker_class = "gthread"
workers = 1
threads = 8
# gunicorn 27's control socket lives in ~/.gunicorn and would be shared by every instance on the host.
control_socket_disable = True
# Path only (%(U)s), never the query string, so nothing a client puts in a URL reaches the log.
accesslog = "-"
access_log_format = '%(h)s "%(m)s %(U)s %(H)s" %(s)s %(b)s %(M)sms'


def post_worker_init(worker):
    """Start this worker's delivery scanner (never in the master: workers could not reach it)."""
    worker.wsgi.extensions["delivery"].start()


def worker_exit(server, worker):
    """Stop the scanner cleanly; unfinished attempts are retried once their lease expires."""
    dispatcher = getattr(worker, "wsgi", None) and worker.wsgi.extensions.get("delivery")
    if dispatcher:
        dispatcher.stop()
