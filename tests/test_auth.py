"""Authentication: one indistinguishable 401 for every bad key, 403 for a missing scope."""

import pytest

from partner.edge.auth import bearer_key
from partner.keys import parse_key
from models import Event, db
from tests.support import ME, PUBLIC_URL, WEBHOOKS, assert_problem, bearer, json_of



def assert_unauthorized(response):
    assert response.status_code == 401
    assert response.content_type == "application/problem+json"
    assert response.headers["WWW-Authenticate"] == 'Bearer realm="partner-api"'
    assert response.get_json() == {"type": "about:blank", "title": "Unauthorized", "status": 401,
                                   "detail": "A valid API key is required, sent as 'Authorization: Bearer vck_...'.",
                                   "code": "unauthorized"}


def test_missing_header_is_401(client):
    assert_unauthorized(client.get(ME))


@pytest.mark.parametrize("header", [
    "", "Bearer", "Bearer ", "vck_", "vck_short.secret", "Bearer vck_abc",
    "Bearer vck_AAAAAAAAAAAAAAAAAAAA", "Token vck_AAAAAAAAAAAAAAAAAAAA.xxx", "Bearer a b",
    "Bearer vck_AAAAAAAAAAAAAAAA.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\u00e9",
])
def test_malformed_key_is_401(client, header):
    assert_unauthorized(client.get(ME, headers={"Authorization": header}))


def test_unknown_key_id_is_401(client, api_key):
    key_id, secret = parse_key(api_key)
    assert_unauthorized(client.get(ME, headers={"Authorization": f"Bearer vck_{'Z' * 20}.{secret}"}))


def test_wrong_secret_is_401(client, api_key):
    key_id, secret = parse_key(api_key)
    wrong = ("A" if secret[0] != "A" else "B") + secret[1:]
    assert_unauthorized(client.get(ME, headers={"Authorization": f"Bearer vck_{key_id}.{wrong}"}))


def test_basic_auth_is_refused(client, api_key):
    import base64
    basic = base64.b64encode(f"{api_key}:".encode()).decode()
    assert_unauthorized(client.get(ME, headers={"Authorization": f"Basic {basic}"}))


def test_key_in_query_string_is_not_accepted(client, api_key):
    assert_unauthorized(client.get(ME, query_string={"api_key": api_key}))


@pytest.mark.parametrize("template", ["Bearer {}", "bearer {}", "BEARER  {}", "{}", "  Bearer {}  "])
def test_bearer_scheme_any_case_or_bare_key(client, api_key, template):
    assert client.get(ME, headers={"Authorization": template.format(api_key)}).status_code == 200


def test_bearer_key_parsing():
    assert bearer_key("Bearer abc") == "abc"
    assert bearer_key("abc") == "abc"
    assert bearer_key("Basic abc") is None
    assert bearer_key(None) is None


@pytest.mark.parametrize("method, path", [
    ("post", WEBHOOKS), ("get", WEBHOOKS), ("delete", WEBHOOKS + "/{id}"), ("post", WEBHOOKS + "/{id}/test"),
    ("get", WEBHOOKS + "/{id}/failures")], ids=["create", "list", "delete", "test", "failures"])
def test_a_key_without_the_scope_is_403_naming_it_and_changes_nothing(app, client, issue_key, method, path):
    manager = bearer(issue_key())
    subscription = json_of(client.post(WEBHOOKS, json={"url": PUBLIC_URL}, headers=manager), 201)
    body = {"url": PUBLIC_URL, "secret": subscription["secret"]} if method == "post" else None
    response = getattr(client, method)(path.format(id=subscription["id"]), json=body,
                                       headers=bearer(issue_key(scopes=())))
    assert_problem(response, 403, "insufficient_scope")
    assert response.get_json()["detail"] == "This endpoint requires the 'webhooks:manage' scope."
    assert response.headers["WWW-Authenticate"] == 'Bearer error="insufficient_scope", scope="webhooks:manage"'
    assert [s["id"] for s in json_of(client.get(WEBHOOKS, headers=manager), 200)["data"]] == [subscription["id"]]
    with app.app_context(), db.connection_context():
        assert Event.select().count() == 0


def test_identity_read_is_granted_to_every_key(client, issue_key):
    key = issue_key(scopes=())
    assert client.get(ME, headers=bearer(key)).status_code == 200


def test_every_api_route_requires_exactly_one_scope(app):
    from partner.keys import GRANTABLE_SCOPES
    api_views = [view for name, view in app.view_functions.items() if name.startswith("api.")]
    assert api_views
    assert all(getattr(view, "required_scope", None) in GRANTABLE_SCOPES for view in api_views)
