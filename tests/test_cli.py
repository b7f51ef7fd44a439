"""The operator CLI: `flask keys create|list|revoke|rotate`."""

import pytest

from partner.keys import RESERVED_SCOPES, parse_key
from tests.support import ME, bearer



@pytest.fixture
def flask_keys(app):
    runner = app.test_cli_runner()
    return lambda *args: runner.invoke(args=["keys", *args])


def me_status(client, key):
    return client.get(ME, headers=bearer(key)).status_code


def created_key(result) -> str:
    assert result.exit_code == 0, result.output
    return result.stdout.strip().splitlines()[-1]


def test_create_prints_the_full_key_alone_on_the_last_stdout_line(flask_keys, client):
    key = created_key(flask_keys("create", "--org", "acme", "--scope", "webhooks:manage"))
    assert parse_key(key) is not None
    assert client.get(ME, headers={"Authorization": key}).get_json()["scopes"] == \
        ["identity:read", "webhooks:manage"]


def test_create_sets_the_organization_rate_limit(flask_keys, client):
    key = created_key(flask_keys("create", "--org", "slow", "--rate-limit", "7"))
    assert client.get(ME, headers={"Authorization": key}).get_json()["rate_limit_per_minute"] == 7


@pytest.mark.both_databases
def test_create_takes_the_largest_rate_limit(flask_keys, client):
    key = created_key(flask_keys("create", "--org", "fast", "--rate-limit", "1000000"))
    assert client.get(ME, headers={"Authorization": key}).get_json()["rate_limit_per_minute"] == 1_000_000


@pytest.mark.both_databases
@pytest.mark.parametrize("limit", ["0", "1000001", str(2**31), "99999999999999999999", "many"])
def test_create_refuses_a_rate_limit_out_of_bounds_cleanly(flask_keys, limit):
    result = flask_keys("create", "--org", "fast", "--rate-limit", limit)
    assert result.exit_code == 2 and "--rate-limit" in result.output, result.output
    assert isinstance(result.exception, SystemExit)  # a usage error, not a traceback


@pytest.mark.parametrize("scope", sorted(RESERVED_SCOPES))
def test_create_refuses_a_reserved_scope_naming_it(flask_keys, scope):
    result = flask_keys("create", "--org", "acme", "--scope", scope)
    assert result.exit_code != 0
    assert scope in result.output and "reserved" in result.output
    assert "vck_" not in result.output


def test_create_refuses_an_unknown_scope_naming_it(flask_keys):
    result = flask_keys("create", "--org", "acme", "--scope", "admin:all")
    assert result.exit_code != 0
    assert "'admin:all' does not exist" in result.output


@pytest.mark.parametrize("slug", ["Acme", "-acme", "", "a" * 64, "ac me", "acmé"])
def test_create_refuses_a_bad_slug(flask_keys, slug):
    assert flask_keys("create", "--org", slug).exit_code != 0


def test_list_shows_keys_but_never_a_secret(flask_keys):
    key = created_key(flask_keys("create", "--org", "acme"))
    key_id, secret = parse_key(key)
    result = flask_keys("list")
    assert result.exit_code == 0
    assert key_id in result.output and "acme" in result.output
    assert secret not in result.output


def test_list_filters_by_organization(flask_keys):
    created_key(flask_keys("create", "--org", "acme"))
    other_id, _ = parse_key(created_key(flask_keys("create", "--org", "other")))
    assert other_id not in flask_keys("list", "--org", "acme").output


def test_revoke_takes_effect_on_the_very_next_request(flask_keys, client):
    key = created_key(flask_keys("create", "--org", "acme"))
    assert me_status(client, key) == 200
    assert flask_keys("revoke", parse_key(key)[0]).exit_code == 0
    assert me_status(client, key) == 401


def test_revoke_unknown_key_fails(flask_keys):
    result = flask_keys("revoke", "nosuchkey")
    assert result.exit_code != 0 and "No key" in result.output


def test_rotate_issues_a_key_with_the_same_scopes_and_revokes_the_old(flask_keys, client):
    old = created_key(flask_keys("create", "--org", "acme", "--scope", "webhooks:manage", "--rate-limit", "9"))
    new = created_key(flask_keys("rotate", parse_key(old)[0]))
    assert new != old
    assert me_status(client, old) == 401
    body = client.get(ME, headers={"Authorization": new}).get_json()
    assert (body["organization"], body["scopes"], body["rate_limit_per_minute"]) == \
        ("acme", ["identity:read", "webhooks:manage"], 9)


def test_a_revoked_key_cannot_be_rotated(flask_keys):
    old = created_key(flask_keys("create", "--org", "acme"))
    flask_keys("revoke", parse_key(old)[0])
    assert flask_keys("rotate", parse_key(old)[0]).exit_code != 0
