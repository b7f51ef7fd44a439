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

# Access lines go to stdout; the service's own loggers (one line per delivery attempt) to stderr
# beside gunicorn's.
# Never DEBUG for libraries: requests/urllib3 would log full target URLs.
logconfig_dict = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s [%(process)d] [%(levelname)s] %(name)s: %(message)s"},
        "access": {"format": "%(asctime)s %(message)s"},
    },
    "handlers": {
        "stderr": {"class": "logging.StreamHandler", "formatter": "plain", "stream": "ext://sys.stderr"},
        "stdout": {"class": "logging.StreamHandler", "formatter": "access", "stream": "ext://sys.stdout"},
    },
    "root": {"level": os.environ.get("PARTNER_LOG_LEVEL", "INFO"), "handlers": ["stderr"]},
    "loggers": {
        "gunicorn.error": {"level": "INFO", "handlers": ["stderr"], "propagate": False},
        "gunicorn.access": {"level": "INFO", "handlers": ["stdout"], "propagate": False},
        "apscheduler": {"level": "WARNING"},
        "urllib3": {"level": "WARNING"},
    },
}


def post_worker_init(worker):
    """Start this worker's delivery scanner (never in the master: workers could not reach it)."""
    worker.wsgi.extensions["delivery"].start()


def worker_exit(server, worker):
    """Stop the scanner cleanly; unfinished attempts are retried once their lease expires."""
    dispatcher = getattr(worker, "wsgi", None) and worker.wsgi.extensions.get("delivery")
    if dispatcher:
        dispatcher.stop()
