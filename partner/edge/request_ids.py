"""Request ids: every response carries X-Request-Id (the client's when it is sane, else a fresh one),
and every log line written while a request is served carries the same id."""

import logging
import re
import secrets

from flask import Flask, g, has_request_context, request

HEADER = "X-Request-Id"
_ENVIRON_KEY = "HTTP_" + HEADER.upper().replace("-", "_")  # the WSGI spelling of the header
# What we keep: short and plain, inert in a log line or a header, and never a lone `-` or `.`, which an
# access line shows for "none". A UUID, a trace id or nginx's $request_id fits; anything else is
# replaced, not trimmed.
_SANE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def install_request_ids(app: Flask) -> None:
    """Put the id on every response (the id itself is chosen when first asked for)."""
    app.after_request(_expose)


def current_request_id() -> str | None:
    """This request's id, chosen the first time anything asks for it (a log line, an error, the
    response); None outside a request."""
    if not has_request_context():
        return None
    if "request_id" not in g:
        sent = request.environ.get(_ENVIRON_KEY, "")
        # 128 bits as 32 hex digits, from `secrets`: `random`'s next ids were predicted from 156
        # responses' ids (its whole state shows through), so a client could foretell others' ids.
        g.request_id = sent if _SANE.fullmatch(sent) else secrets.token_hex(16)
    return g.request_id


def _expose(response):
    response.headers.add(HEADER, current_request_id())  # nothing else sets it: no need to replace one
    return response


class RequestIdFilter(logging.Filter):
    """Adds `request_id` to every record (None outside a request), for the formatters."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = current_request_id()
        return True
