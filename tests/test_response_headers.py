"""response_headers.py: every response is no-store and nosniff; the /docs assets keep their own caching."""

import pytest

from tests.support import ME, PUBLIC_URL, WEBHOOKS


def requests_of_every_kind(client, auth):
    return {
        "created, with its secret": client.post(WEBHOOKS, json={"url": PUBLIC_URL}, headers=auth),
        "read": client.get(ME, headers=auth),
        "listed": client.get(WEBHOOKS, headers=auth),
        "unauthorized": client.get(ME),
        "invalid": client.post(WEBHOOKS, json={"colour": "red"}, headers=auth),
        "not found": client.get("/no/such/path"),
        "not allowed": client.put(WEBHOOKS, headers=auth),
        "health": client.get("/healthz"),
        "the document": client.get("/openapi.json"),
        "the docs page": client.get("/docs"),
    }


def test_every_answer_is_no_store_and_nosniff(client, auth):
    for kind, response in requests_of_every_kind(client, auth).items():
        assert response.headers.get("Cache-Control") == "no-store", kind
        assert response.headers.get("X-Content-Type-Options") == "nosniff", kind


@pytest.mark.parametrize("asset", ["swagger-ui.css", "swagger-ui-bundle.js"])
def test_docs_assets_keep_their_own_caching_and_are_nosniff(client, asset):
    response = client.get(f"/docs/assets/{asset}")
    assert response.status_code == 200
    assert "max-age=86400" in response.headers["Cache-Control"]
    assert "no-store" not in response.headers["Cache-Control"]
    assert response.headers["X-Content-Type-Options"] == "nosniff"
