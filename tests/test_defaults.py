"""Every default the documents state is the code's: the configuration table of docs/operations.md row
by row against partner/config.py DEFAULTS, and each sentence of README.md, docs/*.md and openapi.yaml
(and the systemd unit, and schema.sql) that states one (the retry schedule, attempts, the auto-disable
threshold, the delivery timeout, the body limit, page sizes, the rate limit) read back into a value. A
default changed in the code alone, or in one document alone, fails here; so does a sentence reworded
out of its pattern (then fix the pattern: the sentence must stay tied)."""

import json
import re
from pathlib import Path

import pytest
import yaml

from partner.config import DEFAULTS, SEAMS
from partner.edge.pagination import DEFAULT_LIMIT, MAX_LIMIT
from partner.keys import DEFAULT_RATE_LIMIT
from partner.outbound import sockets
from partner.safe_text import EXCERPT_BYTES
from partner.subscriptions import MAX_SUBSCRIPTIONS

ROOT = Path(__file__).resolve().parent.parent
DELAYS = DEFAULTS["DELIVERY_RETRY_DELAYS"]
UNITS = {"s": 1, "min": 60, "h": 3600}


def text_of(name: str) -> str:
    """A document with its line breaks and indentation folded into single spaces, as it reads."""
    return " ".join((ROOT / name).read_text().split())


def seconds(schedule: str) -> list[int]:
    """`1 min, 5 min, 30 min, 2 h, 6 h and 24 h` as seconds."""
    return [int(number) * UNITS[unit] for number, unit in re.findall(r"(\d+) (s|min|h)\b", schedule)]


def integer(text: str) -> int:
    return int(text.replace(",", ""))


SCHEDULE = r"((?:\d+ (?:s|min|h), )*\d+ (?:s|min|h) and \d+ (?:s|min|h))"

# (document, pattern with one group, how the group reads, the code's value)
STATED = [
    ("docs/webhooks.md", rf"retried after {SCHEDULE}", seconds, DELAYS),
    ("openapi.yaml", rf"retried after {SCHEDULE}", seconds, DELAYS),
    ("openapi.yaml", r"\((\d+) attempts in all", int, len(DELAYS) + 1),
    ("openapi.yaml", r"from 1 to (\d+) \(attempts per event", int, len(DELAYS) + 1),
    ("openapi.yaml", r"1 to (\d+) with the default retry delays", int, len(DELAYS) + 1),
    ("docs/webhooks.md", r"`X-VC-Attempt` \| `1` to `(\d+)`", int, len(DELAYS) + 1),
    ("README.md", r"auto-disabled after (\d+) consecutive failures", int, DEFAULTS["AUTO_DISABLE_THRESHOLD"]),
    ("docs/webhooks.md", r"After (\d+) failed attempts in a row", int, DEFAULTS["AUTO_DISABLE_THRESHOLD"]),
    ("openapi.yaml", r"After (\d+) consecutive failed attempts", int, DEFAULTS["AUTO_DISABLE_THRESHOLD"]),
    ("openapi.yaml", r"resets it to 0\. At (\d+) the", int, DEFAULTS["AUTO_DISABLE_THRESHOLD"]),
    ("docs/webhooks.md", r"2xx within (\d+) seconds", int, DEFAULTS["DELIVERY_TIMEOUT"]),
    ("openapi.yaml", r"2xx within (\d+) seconds", int, DEFAULTS["DELIVERY_TIMEOUT"]),
    ("openapi.yaml", r"Any 2xx within (\d+) s\b", int, DEFAULTS["DELIVERY_TIMEOUT"]),
    ("docs/decisions.md", r"One over (\d+) KiB is 413", int, DEFAULTS["MAX_CONTENT_LENGTH"] / 1024),
    ("docs/decisions.md", r"is over (\d+) KiB, the most this API accepts", int, DEFAULTS["MAX_CONTENT_LENGTH"] / 1024),
    ("docs/deploying.md", r"Bodies are capped at (\d+) KiB", int, DEFAULTS["MAX_CONTENT_LENGTH"] / 1024),
    ("openapi.yaml", r"The body is over (\d+) KiB", int, DEFAULTS["MAX_CONTENT_LENGTH"] / 1024),
    ("openapi.yaml", r"is over (\d+) KiB, the most this API accepts", int, DEFAULTS["MAX_CONTENT_LENGTH"] / 1024),
    ("docs/decisions.md", r"`limit` is 1–(\d+)", int, MAX_LIMIT),
    ("docs/decisions.md", r"`limit` is 1–\d+ \(default (\d+)\)", int, DEFAULT_LIMIT),
    ("docs/decisions.md", r"take `limit` \(1–(\d+)", int, MAX_LIMIT),
    ("docs/decisions.md", r"take `limit` \(1–\d+, default (\d+)", int, DEFAULT_LIMIT),
    ("openapi.yaml", r"Page size, an integer from 1 to (\d+)\.", int, MAX_LIMIT),
    ("openapi.yaml", r"\((\d+) a minute unless the operator", int, DEFAULT_RATE_LIMIT),
    ("docs/decisions.md", r'`RateLimit-Policy: "org";q=(\d+);w=60`', int, DEFAULT_RATE_LIMIT),
    ("docs/operations.md", r"organization \(default (\d+)\)", int, DEFAULT_RATE_LIMIT),
    ("README.md", r'"rate_limit_per_minute":(\d+)', int, DEFAULT_RATE_LIMIT),
    ("openapi.yaml", r"Rate limit of (\d+) requests per minute exceeded", int, DEFAULT_RATE_LIMIT),
    ("openapi.yaml", r"At most (\d+) subscriptions per organization", int, MAX_SUBSCRIPTIONS),
    ("openapi.yaml", r"the first (\d+) bytes of your answer", int, EXCERPT_BYTES),
    ("docs/operations.md", r"excerpts keep at most ([\d,]+) bytes", integer, EXCERPT_BYTES),
    ("docs/operations.md", r"`PARTNER_RETENTION_DAYS` \((\d+)\) days", int, DEFAULTS["RETENTION_DAYS"]),
    ("deploy/systemd/partner.service", r"PARTNER_DELIVERY_TIMEOUT, (\d+) s by default", int,
     DEFAULTS["DELIVERY_TIMEOUT"]),
    ("schema.sql", r'"rate_limit_per_minute" INTEGER NOT NULL DEFAULT (\d+)', int, DEFAULT_RATE_LIMIT),
    ("docs/operations.md", r"at most \*\*(\d+) idle connections\*\* in all", int, sockets.MOST_IDLE),
    ("docs/operations.md", r"none kept idle longer than \*\*(\d+) s\*\*", int, sockets.IDLE_SECONDS),
    ("docs/operations.md", r"read once, at start\), less \*\*(\d+)\*\*", int, sockets.RESERVE),
    ("docs/deploying.md", r"at most (\d+) idle partner connections", int, sockets.MOST_IDLE),
    ("docs/deploying.md", r"idle partner connections \((\d+) s each", int, sockets.IDLE_SECONDS),
    ("docs/deploying.md", r"`LimitNOFILE` less (\d+) kept", int, sockets.RESERVE),
    ("deploy/systemd/partner.service", r"at most (\d+) idle partner connections", int, sockets.MOST_IDLE),
    ("deploy/systemd/partner.service", r"idle partner connections \((\d+) s each", int, sockets.IDLE_SECONDS),
    ("deploy/systemd/partner.service", r"this limit less (\d+) for", int, sockets.RESERVE),
]


@pytest.mark.parametrize("document, pattern, read, expected", STATED,
                         ids=[f"{doc}:{re.sub(r'[^ A-Za-z0-9-]', '', pattern)[:40]}" for doc, pattern, _, _ in STATED])
def test_each_stated_default_is_the_codes(document, pattern, read, expected):
    found = [read(match) for match in re.findall(pattern, text_of(document))]
    assert found, f"{document} no longer says this (reworded? tie the new words here): {pattern}"
    assert found == [expected] * len(found)


def configuration_table() -> dict[str, str]:
    """docs/operations.md's configuration table: variable name (no prefix) -> the default column's text."""
    rows = re.findall(r"^\| `PARTNER_([A-Z_]+)` \| ([^|]+) \|", (ROOT / "docs/operations.md").read_text(), re.M)
    return {name: default.strip() for name, default in rows}


def as_setting(text: str):
    """The table's way of writing a value, as the configuration holds it: `60` is 60, `text` is "text",
    *(unset)* is None, *(empty)* is ""."""
    if text == "*(unset)*":
        return None
    if text == "*(empty)*":
        return ""
    value = text.strip("`")
    try:
        return json.loads(value)
    except ValueError:
        return value


def test_the_configuration_table_lists_every_setting_with_the_codes_default():
    table = configuration_table()
    settings = {name: value for name, value in DEFAULTS.items() if name not in SEAMS}
    assert sorted(table) == sorted(settings)
    documented = {name: as_setting(text) for name, text in table.items()}
    # A file path the code fills in at start-up: the table says where it lands.
    documented["ENCRYPTION_KEY_FILE"] = "" if documented["ENCRYPTION_KEY_FILE"] == "instance/encryption.key" else \
        documented["ENCRYPTION_KEY_FILE"]
    assert documented == settings


def test_the_openapi_page_size_schema_is_the_codes():
    document = yaml.safe_load((ROOT / "openapi.yaml").read_text())
    schema = document["components"]["parameters"]["limit"]["schema"]
    assert (schema["minimum"], schema["maximum"], schema["default"]) == (1, MAX_LIMIT, DEFAULT_LIMIT)

