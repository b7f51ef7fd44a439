"""logs.py on a real gunicorn: no byte a client sends starts a log line or reaches a terminal as a
control sequence, in text and in JSON, and a malformed request costs one bounded line."""

import json
import logging
import re
import sys

import pytest

from partner.telemetry.logs import logging_config
from tests.gunicorn_server import Gunicorn
from tests.support import raw_exchange

FORGED = "2026-11-23 21:00:00,000 [4242] [WARNING] app: operator action: key vck_x revoked"
# The path as a client means it, and as it goes on the wire (%-encoded; nginx passes it as it is).
HOSTILE_PATHS = {
    "/api/v1/partner/me\r\n" + FORGED: "/api/v1/partner/me%0D%0A" + FORGED.replace(" ", "%20"),
    "/api/v1/partner/me\x1b[2K": "/api/v1/partner/me%1B[2K",
    "/api/v1/partner/me\x9b2K\x7f\x00": "/api/v1/partner/me%C2%9B2K%7F%00",
    "/api/v1/partner/me\u202etxt.exe": "/api/v1/partner/me%E2%80%AEtxt.exe",
}
# How every log line, text or JSON (once decoded), shows each of them.
ESCAPED_PATHS = ["/api/v1/partner/me\\r\\n" + FORGED, "/api/v1/partner/me\\x1b[2K",
                 "/api/v1/partner/me\\x9b2K\\x7f\\x00", "/api/v1/partner/me\\u202etxt.exe"]
# Any raw control character but the newline that ends each line.
RAW_CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029]")
# In a decoded JSON field (a traceback keeps its newlines), and the bidi controls too.
RAW_IN_A_FIELD = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


@pytest.fixture(params=["text", "json"])
def server(request, server_env, smoke_key, tmp_path, session):
    started = Gunicorn({**server_env, "PARTNER_LOG_FORMAT": request.param}, tmp_path)
    started.log_format = request.param
    started.wait_until_serving(session)
    yield started
    if started.process.poll() is None:
        started.process.kill()
        started.process.wait(timeout=5)


def get(server, target: str, extra: bytes = b"") -> int:
    request = f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1\r\n".encode() + extra + b"Connection: close\r\n\r\n"
    return raw_exchange(server.port, request)[0]


def logged(server) -> tuple[str, str]:
    assert server.stop() == 0
    out, err = server.output()
    assert not RAW_CONTROL.search(out + err), [line for line in (out + err).splitlines()
                                               if RAW_CONTROL.search(line)]
    if server.log_format == "json":
        fields = [(name, value) for line in (out + err).splitlines() for name, value in json.loads(line).items()]
        assert [(name, value) for name, value in fields if isinstance(value, str) and name != "exc_info"
                and RAW_IN_A_FIELD.search(value)] == []
    return out, err


def test_a_path_with_control_characters_leaves_one_access_line_and_no_raw_control_byte(server):
    for target in HOSTILE_PATHS.values():
        assert get(server, target) == 404
    out, err = logged(server)
    hostile = [line for line in out.splitlines() if "/api/v1/partner/me" in line]
    assert len(hostile) == len(HOSTILE_PATHS), out
    assert not any(line.startswith(FORGED) for line in (out + err).splitlines())
    if server.log_format == "json":
        assert [json.loads(line)["path"] for line in hostile] == ESCAPED_PATHS
    else:
        assert [line.split('"')[1] for line in hostile] == [f"GET {path} HTTP/1.1" for path in ESCAPED_PATHS]


@pytest.mark.parametrize("request_line, headers", [
    ("GET /a\x1b[2K" + "A" * 4000 + " HTTP/1.1", ""),                  # a request line gunicorn refuses
    ("GET /a HTTP/1.1", "X-Bad\x1b[2K" + "B" * 4000 + ": v\r\n"),       # a header name it refuses
    ("G\x1b[2KET /a HTTP/1.1", ""),                                     # a method
])
def test_a_malformed_request_costs_at_most_one_bounded_line(server, request_line, headers):
    raw = f"{request_line}\r\nHost: 127.0.0.1\r\n{headers}Connection: close\r\n\r\n".encode()
    assert raw_exchange(server.port, raw)[0] == 400
    out, err = logged(server)
    # Neither an access line (the only one is wait_until_serving's GET /) nor a second warning.
    assert [line for line in out.splitlines() if '"GET / HTTP/1.1"' not in line and '"/"' not in line] == []
    about_it = [line for line in err.splitlines() if "[2K" in line or "Invalid request" in line]
    assert len(about_it) == 1, about_it
    assert len(about_it[0]) < 500


def test_a_traceback_keeps_its_lines_but_shows_no_raw_control_character():
    formatter = logging_config("text", "INFO")["formatters"]["service"]["()"]()
    try:
        raise ValueError("bad path /me\x1b[2K\r")
    except ValueError:
        record = logging.LogRecord("app", logging.ERROR, __file__, 1, "unhandled %s", ("x\x1b",),
                                   sys.exc_info())
    text = formatter.format(record)
    assert text.startswith("unhandled x\\x1b\nTraceback")
    assert text.endswith("ValueError: bad path /me\\x1b[2K\\r")


def test_every_field_of_a_json_line_is_escaped_once_decoded_and_a_traceback_keeps_its_lines():
    spec = dict(logging_config("json", "INFO")["formatters"]["service"])
    formatter = spec.pop("()")(**spec)
    try:
        raise ValueError("bad path /me\x1b[2K\r")
    except ValueError:
        record = logging.LogRecord("app", logging.ERROR, __file__, 1, "unhandled %s", ("x\x9b\u202e",),
                                   sys.exc_info())
    record.subscription_id = "wh_\x85\u2066"  # a field of its own, as a delivery line has
    line = json.loads(formatter.format(record))
    assert (line["message"], line["subscription_id"]) == ("unhandled x\\x9b\\u202e", "wh_\\x85\\u2066")
    assert line["exc_info"].startswith("Traceback") and "\n" in line["exc_info"]
    assert line["exc_info"].endswith("ValueError: bad path /me\\x1b[2K\\r")
