"""No input ever produces a 500: seeded random bodies, paths, queries and headers on every endpoint,
on SQLite and on PostgreSQL (which refuses NUL in text where SQLite stores it)."""

import json
import random

import pytest

from tests.support import API

pytestmark = pytest.mark.both_databases

STRINGS = ["", " ", "a" * 3000, "http://93.184.215.14/x", "https://hooks.partner.example/h",
           "http://127.0.0.1:8080/", "whsec_" + "A" * 43, "\u0000", "\U0001F600", "é" * 300,
           "%00", "../../etc/passwd", "http://[::1]/", "http://0x7f.1/", "\u202e", "null", "1e999"]
SCALARS = [None, True, False, 0, -1, 2**63, 10**40, 1.5, -0.0, 1e308, *STRINGS]


def value(rng: random.Random, depth: int = 0):
    roll = rng.random()
    if depth < 3 and roll < 0.15:
        return [value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    if depth < 3 and roll < 0.3:
        return body(rng, depth + 1)
    return rng.choice(SCALARS)


def body(rng: random.Random, depth: int = 0) -> dict:
    keys = ["url", "description", "secret", rng.choice(STRINGS)]
    return {rng.choice(keys): value(rng, depth) for _ in range(rng.randint(0, 4))}


def raw_body(rng: random.Random) -> bytes:
    choice = rng.random()
    if choice < 0.7:
        return json.dumps(body(rng)).encode()
    if choice < 0.85:
        return bytes(rng.randrange(256) for _ in range(rng.randint(0, 200)))
    return rng.choice([b"", b"{", b"[]", b'{"url": NaN}', b"\xef\xbb\xbf{}", b'{"a":1}' * 3, b"0"])


@pytest.fixture
def subscription_id(client, auth):
    response = client.post(f"{API}/webhooks", json={"url": "http://93.184.215.14/hook"}, headers=auth)
    return response.get_json()["id"]


def assert_not_a_crash(response):
    assert response.status_code < 500, response.get_data()
    if response.status_code >= 400:
        assert response.content_type == "application/problem+json"
        assert "Traceback" not in response.get_data(as_text=True)


@pytest.mark.parametrize("seed", range(20))
def test_random_requests_never_crash(client, auth, subscription_id, seed):
    rng = random.Random(seed)
    ids = [subscription_id, "wh_nope", "", "%00", "é", "a" * 500, "..%2f"]
    for _ in range(25):
        sid = rng.choice(ids)
        method, path = rng.choice([
            ("GET", "/me"), ("POST", "/webhooks"), ("GET", "/webhooks"), ("DELETE", f"/webhooks/{sid}"),
            ("POST", f"/webhooks/{sid}/test"), ("GET", f"/webhooks/{sid}/failures"), ("PATCH", "/webhooks"),
        ])
        query = {rng.choice(["limit", "cursor", "x"]): rng.choice(STRINGS + ["5", "0", "-1", "101"])}
        headers = dict(auth) if rng.random() < 0.9 else {"Authorization": rng.choice(STRINGS)}
        if method == "DELETE" and sid == subscription_id:
            continue  # keep the subscription for the rest of the run
        assert_not_a_crash(client.open(API + path, method=method, data=raw_body(rng),
                                       query_string=query, headers=headers))


def event(rng: random.Random, depth: int = 0):
    """A publish body's event: its fields, and others, with random values (sometimes right)."""
    fields = {"organization": rng.choice(["acme", *STRINGS]), "event": rng.choice(["lead.created", "vc.test.ping",
                                                                                   *STRINGS]),
              "data": rng.choice([{"lead_id": "ld_1"}, value(rng, depth)]), "occurred_at": value(rng, depth),
              rng.choice(STRINGS): value(rng, depth)}
    return {name: fields[name] for name in rng.sample(list(fields), rng.randint(0, len(fields)))}


@pytest.mark.parametrize("seed", range(10))
def test_random_publishes_never_crash(client, credential, auth, seed):
    client.post(f"{API}/webhooks", json={"url": "http://93.184.215.14/hook", "events": ["lead.*"]}, headers=auth)
    rng = random.Random(seed)
    for _ in range(20):
        batch = rng.random() < 0.5
        payload = ({"events": [event(rng) for _ in range(rng.randint(0, 6))], **body(rng)} if batch else event(rng))
        data = json.dumps(payload).encode() if rng.random() < 0.8 else raw_body(rng)
        headers = {"Authorization": f"Bearer {credential}" if rng.random() < 0.9 else rng.choice(STRINGS)}
        if rng.random() < 0.5:
            headers["Idempotency-Key"] = rng.choice(["k1", "k2", *STRINGS[:4], "\u00e9t\u00e9", "x" * 300])
        path = "/internal/v1/events" + ("/batch" if batch else "")
        assert_not_a_crash(client.open(path, method="POST", data=data, headers=headers,
                                       content_type="application/json"))
