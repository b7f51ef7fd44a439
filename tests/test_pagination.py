"""Cursors (partner/edge/pagination.py) over HTTP: opaque, bound to the organization and the listing
that issued them, expiring after 24 hours; whatever is sent as a cursor, 422 invalid_cursor, never a
500. Pages themselves: test_webhooks.py (subscriptions) and test_delivery.py (failures)."""

import base64
import binascii
import hashlib
import hmac
import json
import struct

import pytest

from models import Organization, Setting, Subscription, db
from partner.edge.pagination import CURSOR_LIFETIME_MS
from tests.support import WEBHOOKS, bearer, field_codes, run_through_backoffs, validation_errors

CLOCK_START = 1_800_000_000.0005  # 2027-01-15T08:00:00.000Z
URL = "http://93.184.215.14/hook"
B64URL = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
INVALID_CURSOR = {"field": "cursor", "code": "invalid_cursor",
                  "message": "This cursor was not issued for this list, or has expired."}


def create(client, headers) -> dict:
    response = client.post(WEBHOOKS, json={"url": URL}, headers=headers)
    assert response.status_code == 201, response.get_json()
    return response.get_json()


def next_cursor(client, headers) -> str:
    for _ in range(2):
        create(client, headers)
    cursor = client.get(WEBHOOKS, query_string={"limit": 1}, headers=headers).get_json()["next_cursor"]
    assert cursor
    return cursor


def listed_with(client, headers, cursor: str):
    return client.get(WEBHOOKS, query_string={"limit": 1, "cursor": cursor}, headers=headers)


def assert_invalid_cursor(response):
    assert validation_errors(response) == [INVALID_CURSOR]


# --- nothing readable -------------------------------------------------------------------------------

def readings(cursor: str) -> list[bytes]:
    """Every reading a curious partner might try: the text, and it (or each dot-separated part, as
    release 1.2's were) base64-decoded, URL-safe or standard, from each of the first four offsets."""
    found = [cursor.encode()]
    for part in {cursor, *cursor.split(".")}:
        for start in range(4):
            text = part[start:]
            for alphabet in (text, text.replace("-", "+").replace("_", "/")):
                try:
                    found.append(base64.b64decode(alphabet + "=" * (-len(alphabet) % 4), altchars=b"-_"))
                    found.append(base64.b64decode(alphabet + "=" * (-len(alphabet) % 4)))
                except (binascii.Error, ValueError):
                    pass
    return found


def is_json(data: bytes) -> bool:
    try:
        json.loads(data)
    except ValueError:  # UnicodeDecodeError included
        return False
    return True


def assert_opaque(cursor: str, secrets_: list[str], times_ms: list[int]) -> None:
    for reading in readings(cursor):
        assert not is_json(reading)
        for text in secrets_:
            assert text.encode() not in reading
        for ms in times_ms:
            assert str(ms).encode() not in reading and str(ms // 1000).encode() not in reading
            assert struct.pack(">q", ms) not in reading and struct.pack("<q", ms) not in reading


@pytest.fixture
def acme_ids(app, auth):
    """The calling organization's id and slug, and its subscriptions' ids and creation times."""
    def ids() -> tuple[list[str], list[int]]:
        with app.app_context(), db.connection_context():
            organization = Organization.get(Organization.slug == "acme")
            rows = list(Subscription.select().where(Subscription.organization == organization.id))
            return ([organization.id, organization.slug, *(row.id for row in rows)],
                    [row.created_at for row in rows])
    return ids


def test_no_reading_of_a_subscriptions_cursor_is_json_or_holds_an_id_a_slug_or_a_time(client, auth, acme_ids):
    cursor = next_cursor(client, auth)
    assert_opaque(cursor, *acme_ids())


@pytest.mark.config(WEBHOOK_ALLOWED_NETWORKS=["127.0.0.0/8"])
def test_no_reading_of_a_failures_cursor_is_json_or_holds_an_id_a_slug_or_a_time(
        client, auth, acme_ids, start_receiver, subscribe, ping, dispatcher, failures, clock):
    failing = subscribe(start_receiver(script=[500]).url)
    ping(failing)
    ping(failing)
    run_through_backoffs(dispatcher, clock)
    page = failures(failing, limit=1)
    ids, times = acme_ids()
    every = failures(failing)["data"]
    assert len(every) == 2
    assert_opaque(page["next_cursor"], ids + [f["id"] for f in every] + [f["event_id"] for f in every], times)


def test_two_cursors_for_the_same_position_differ(client, auth):
    cursor = next_cursor(client, auth)
    again = client.get(WEBHOOKS, query_string={"limit": 1}, headers=auth).get_json()["next_cursor"]
    assert again != cursor
    assert listed_with(client, auth, again).get_json() == listed_with(client, auth, cursor).get_json()


# --- forged, replayed, expired -------------------------------------------------------------------------

def flip(text: str, index: int) -> str:
    return text[:index] + ("B" if text[index] == "A" else "A") + text[index + 1:]


def release_1_2_cursor(app, organization_id: str, position: list) -> str:
    """A cursor as release 1.2 made it, signed with this service's own cursor key."""
    with app.app_context(), db.connection_context():
        key = bytes.fromhex(Setting.get_by_id("cursor_signing_key").value)
    b64 = lambda data: base64.urlsafe_b64encode(data).rstrip(b"=").decode()
    payload = b64(json.dumps([f"subscriptions:{organization_id}", position], separators=(",", ":")).encode())
    return f"{payload}.{b64(hmac.new(key, payload.encode(), hashlib.sha256).digest()[:16])}"


FORGERIES = {
    "a bit changed at the start (the nonce)": lambda cursor: flip(cursor, 0),
    "a bit changed in the middle (the ciphertext)": lambda cursor: flip(cursor, len(cursor) // 2),
    "a bit changed at the end (the tag)": lambda cursor: flip(cursor, len(cursor) - 2),
    "only the spare bits of its last character changed": lambda c: c[:-1] + B64URL[B64URL.index(c[-1]) ^ 1],
    "cut short": lambda cursor: cursor[:-6],
    "extended": lambda cursor: cursor + "AAAA",
    "padded": lambda cursor: cursor + "=" * (-len(cursor) % 4 or 4),
    "two glued together": lambda cursor: cursor + cursor,
}


@pytest.mark.parametrize("forge", FORGERIES.values(), ids=FORGERIES.keys())
def test_a_forged_cursor_is_422(client, auth, forge):
    cursor = next_cursor(client, auth)
    assert listed_with(client, auth, cursor).status_code == 200
    assert_invalid_cursor(listed_with(client, auth, forge(cursor)))


@pytest.mark.parametrize("cursor", ["", "garbage!", ".", "a.b", "AAAA", "A" * 54, "x" * 500, "é", "%00", "\x00",
                                    "W10.AAAAAAAAAAAAAAAAAAAAAA", "eyJhIjoxfQ"])
def test_a_cursor_the_service_never_made_is_422(client, auth, cursor):
    assert_invalid_cursor(listed_with(client, auth, cursor))


def test_a_release_1_2_cursor_signed_with_the_services_key_is_422(app, client, auth, acme_ids):
    created = create(client, auth)
    [organization_id, *_] = acme_ids()[0]
    with app.app_context(), db.connection_context():
        created_at = Subscription.get_by_id(created["id"]).created_at
    assert_invalid_cursor(listed_with(client, auth, release_1_2_cursor(app, organization_id, [created_at, created["id"]])))


def test_a_cursor_of_another_organization_is_422(client, issue_key):
    acme, globex = bearer(issue_key("acme")), bearer(issue_key("globex"))
    create(client, globex)
    create(client, globex)
    assert_invalid_cursor(listed_with(client, globex, next_cursor(client, acme)))


def test_a_cursor_is_good_for_24_hours_and_refused_after(client, auth, clock):
    cursor = next_cursor(client, auth)
    clock.advance(CURSOR_LIFETIME_MS / 1000)
    assert listed_with(client, auth, cursor).status_code == 200
    clock.advance(0.001)
    assert_invalid_cursor(listed_with(client, auth, cursor))


def test_bad_limit_and_bad_cursor_are_reported_together(client, auth):
    response = client.get(WEBHOOKS, query_string={"limit": "0", "cursor": "garbage"}, headers=auth)
    assert field_codes(response) == [("limit", "out_of_range"), ("cursor", "invalid_cursor")]


# --- sealed with the service's key, shaped wrong: only someone holding the key could send these ------

def times(issued_ms: int, position_ms: int) -> bytes:
    return struct.pack(">qq", issued_ms, position_ms)


NOW_MS = 1_800_000_000_000
WRONG_SHAPES = {
    "empty": b"",
    "times without an id": times(NOW_MS, 5),
    "too short for the times": b"\x00" * 15,
    "an id holding NUL": times(NOW_MS, 5) + b"wh_\x00x",
    "an id not ASCII": times(NOW_MS, 5) + "wh_é".encode(),
    "an id not UTF-8": times(NOW_MS, 5) + b"wh_\xff",
    "an id too long": times(NOW_MS, 5) + b"x" * 129,
    "a negative time": times(NOW_MS, -1) + b"wh_x",
    "release 1.2's JSON": json.dumps(["subscriptions", [5, "wh_x"]]).encode(),
}


@pytest.mark.both_databases
@pytest.mark.parametrize("plaintext", WRONG_SHAPES.values(), ids=WRONG_SHAPES.keys())
def test_a_cursor_sealed_with_the_key_but_shaped_wrong_is_422_not_500(app, client, auth, acme_ids, plaintext):
    create(client, auth)
    [organization_id, *_] = acme_ids()[0]
    cursor = app.extensions["cursors"]()._seal(organization_id, "subscriptions", plaintext)
    assert_invalid_cursor(listed_with(client, auth, cursor))


@pytest.mark.both_databases
def test_a_cursor_sealed_with_the_key_and_shaped_right_pages_on(app, client, auth, acme_ids, clock):
    first = create(client, auth)
    clock.advance(0.001)
    second = create(client, auth)
    [organization_id, *_] = acme_ids()[0]
    with app.app_context(), db.connection_context():
        created_at = Subscription.get_by_id(first["id"]).created_at
    cursor = app.extensions["cursors"]()._seal(organization_id, "subscriptions",
                                             times(NOW_MS, created_at) + first["id"].encode())
    assert [row["id"] for row in listed_with(client, auth, cursor).get_json()["data"]] == [second["id"]]
