"""GET /me: the identity record and the rate-limit headers."""

import re

from tests.support import ME, bearer

ISO_MS = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


def test_me_returns_the_identity_record(client, issue_key):
    key = issue_key(org="acme", scopes=("webhooks:manage",))
    response = client.get(ME, headers=bearer(key))
    assert response.status_code == 200
    body = response.get_json()
    reset_at = body.pop("rate_limit_reset_at")
    assert ISO_MS.fullmatch(reset_at)
    assert body == {"organization": "acme", "key_id": key[4:].split(".")[0],
                    "scopes": ["identity:read", "webhooks:manage"],
                    "rate_limit_per_minute": 600, "rate_limit_remaining": 599}


def test_me_reports_the_organization_limit(client, issue_key):
    key = issue_key(org="small", rate_limit=5)
    body = client.get(ME, headers={"Authorization": key}).get_json()
    assert (body["rate_limit_per_minute"], body["rate_limit_remaining"]) == (5, 4)


def test_me_carries_rate_limit_headers(client, auth):
    client.get(ME, headers=auth)
    headers = client.get(ME, headers=auth).headers
    assert headers["X-RateLimit-Limit"] == "600"
    assert headers["X-RateLimit-Remaining"] == "598"
    assert headers["X-RateLimit-Reset"].isdigit()
    assert headers["RateLimit-Policy"] == '"org";q=600;w=60'
    assert re.fullmatch(r'"org";r=598;t=(59|60)', headers["RateLimit"])
    assert "Retry-After" not in headers


def test_me_response_is_json(client, auth):
    assert client.get(ME, headers=auth).content_type == "application/json"
