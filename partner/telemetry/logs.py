r"""Log formats for gunicorn.conf.py: PARTNER_LOG_FORMAT=text (default) or json, one object per line.

Access lines go to stdout, the service's own lines (one per delivery attempt, warnings) to stderr;
both carry the request id. Access lines name the path only, never the query string, and no request
header: nothing a client puts in a URL or a header (a key) reaches the log.

No byte a client sends can start a line or reach a terminal as a control sequence: text lines show
control characters escaped (`\r`, `\x1b`), and so does every field of a JSON line, once decoded (a
reader printing a decoded `path` gets no raw escape either); gunicorn's warnings about a malformed
request quote at most CLIENT_TEXT_LIMIT characters of it.
"""

import logging
from urllib.parse import urlsplit

from gunicorn.glogging import Logger
from pythonjsonlogger.json import JsonFormatter

from partner.safe_text import printable

FORMATS = ("text", "json")
ACCESS_FORMAT = '%(h)s "%(m)s %(U)s %(H)s" %(s)s %(b)s %(M)sms %({x-request-id}o)s'


# What a warning about a malformed request quotes of it: one client once wrote 44 MB of log in 0.55 s.
CLIENT_TEXT_LIMIT = 200


def bounded(text: str, limit: int = CLIENT_TEXT_LIMIT) -> str:
    """`text`, cut at `limit` characters with a note of how many were left out."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text) - limit} more characters)"


class OneLineFormatter(logging.Formatter):
    """The text format: each record's message on its one line. A traceback still follows it, its
    lines kept, but nothing else in it (an exception's message may quote a client) reaches a terminal."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return printable(super().formatMessage(record))

    def formatException(self, exc_info) -> str:
        return _printable_lines(super().formatException(exc_info))


class GunicornLogger(Logger):
    """gunicorn's logger (gunicorn.conf.py's logger_class): the logged path is the client's text
    (its bytes as UTF-8), and a warning about a malformed request is bounded."""

    def atoms(self, resp, req, environ, request_time) -> dict:
        atoms = super().atoms(resp, req, environ, request_time)
        atoms["U"] = path_text(atoms["U"])
        return atoms

    def warning(self, msg, *args, **kwargs) -> None:
        # gunicorn formats "Invalid request from ip=...: <the bad bytes>" itself, before logging.
        super().warning(bounded(str(msg) % args if args else str(msg)), **kwargs)


def path_text(wsgi_path: str | None) -> str | None:
    """A WSGI path (bytes as Latin-1 characters) as the client wrote it: UTF-8, bad bytes escaped."""
    return wsgi_path and wsgi_path.encode("latin-1", "backslashreplace").decode("utf-8", "backslashreplace")


class JsonLineFormatter(JsonFormatter):
    """python-json-logger's formatter; an access line also gets its fields one by one, picked from
    gunicorn's atoms (the atoms also hold every request header, so they are never logged whole).
    Every text field is escaped as a text line is; a traceback keeps its lines."""

    def add_fields(self, log_record: dict, record, message_dict: dict) -> None:
        super().add_fields(log_record, record, message_dict)
        atoms = record.args
        if record.name == "gunicorn.access" and isinstance(atoms, dict):
            log_record.update(remote_addr=atoms["h"], method=atoms["m"], path=atoms["U"],
                              status=int(atoms["s"]), bytes=atoms["B"], duration_ms=atoms["M"],
                              request_id=atoms.get("{x-request-id}o"))

    def process_log_record(self, log_data: dict) -> dict:
        for name, value in log_data.items():
            if isinstance(value, str):
                log_data[name] = _printable_lines(value) if name in _MULTILINE_FIELDS else printable(value)
        return log_data


_MULTILINE_FIELDS = ("exc_info", "stack_info")


def _printable_lines(text: str) -> str:
    return "\n".join(map(printable, text.split("\n")))


def logging_config(log_format: str, level: str) -> dict:
    """gunicorn's logconfig_dict for `log_format`; ValueError names the setting if it is unknown."""
    if log_format not in FORMATS:
        raise ValueError(f"PARTNER_LOG_FORMAT must be one of {', '.join(FORMATS)}")
    if log_format == "json":
        fields = "%(levelname)s %(name)s %(process)d %(message)s %(request_id)s"
        service = access = {"()": JsonLineFormatter, "fmt": fields, "timestamp": "time",
                            "rename_fields": {"levelname": "level"}}
    else:
        service = {"()": OneLineFormatter,
                   "fmt": "%(asctime)s [%(process)d] [%(levelname)s] %(name)s: %(message)s"}
        access = {"()": OneLineFormatter, "fmt": "%(asctime)s %(message)s"}
    request_ids = {"request_id": {"()": "partner.edge.request_ids.RequestIdFilter"}}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": request_ids,
        "formatters": {"service": service, "access": access},
        "handlers": {
            "stderr": {"class": "logging.StreamHandler", "formatter": "service",
                       "stream": "ext://sys.stderr", "filters": ["request_id"]},
            "stdout": {"class": "logging.StreamHandler", "formatter": "access",
                       "stream": "ext://sys.stdout"},
        },
        # Never DEBUG for libraries: requests/urllib3 would log full target URLs.
        "root": {"level": level, "handlers": ["stderr"]},
        "loggers": {
            "gunicorn.error": {"level": "INFO", "handlers": ["stderr"], "propagate": False},
            "gunicorn.access": {"level": "INFO", "handlers": ["stdout"], "propagate": False},
            "apscheduler": {"level": "WARNING"},
            "urllib3": {"level": "WARNING"},
        },
    }


class RedactQueryParameters(logging.Filter):
    """peewee logs each query with its parameters at DEBUG, and some parameters are secrets (a
    subscription's signing secret). Keep the SQL, drop the values."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, tuple) and len(record.msg) == 2:
            sql, params = record.msg
            record.msg, record.args = "%s -- %d parameter(s) redacted", (sql, len(params or ()))
        return True


QUERY_LOG_FILTER = RedactQueryParameters()


def database_name(url: str) -> str:
    """PARTNER_DATABASE_URL as a log line may show it: no password, and no query string (libpq
    takes `?password=` there too)."""
    shown = url.split("?", 1)[0].split("#", 1)[0]
    netloc = urlsplit(shown).netloc
    user_info, at, host = netloc.rpartition("@")
    if ":" in user_info:
        shown = shown.replace(netloc, f"{user_info.partition(':')[0]}{at}{host}", 1)
    return shown
