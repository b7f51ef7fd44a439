"""Organizations as the operator sees them: `flask orgs list|set-limit`, and `keys create --rate-limit`,
which sets the budget of a new organization only."""

import pytest

from models import Organization, db
from partner.keys import parse_key
from tests.support import ME, WEBHOOKS, bearer, json_of

pytestmark = pytest.mark.config(WEBHOOK_ALLOWED_NETWORKS=["127.0.0.0/8"], DELIVERY_RETRY_DELAYS=[])


@pytest.fixture
def flask_cli(app):
    runner = app.test_cli_runner()
    return lambda *args: runner.invoke(args=list(args))


def limit_of(client, key: str) -> int:
    return json_of(client.get(ME, headers=bearer(key)), 200)["rate_limit_per_minute"]


def rows(result) -> list[list[str]]:
    assert result.exit_code == 0, result.output
    return [line.split("\t") for line in result.stdout.splitlines()]


@pytest.mark.both_databases
def test_keys_create_refuses_another_limit_for_an_existing_organization_and_changes_nothing(
        flask_cli, issue_key, client, app):
    production = issue_key(org="acme", rate_limit=600)
    result = flask_cli("keys", "create", "--org", "acme", "--rate-limit", "50")
    assert result.exit_code == 1
    assert result.output.count("\n") == 1 and "flask orgs set-limit acme 50" in result.output
    assert "vck_" not in result.output
    assert limit_of(client, production) == 600
    assert [row[1] for row in rows(flask_cli("keys", "list"))[1:]] == ["acme"]  # no second key


def test_keys_create_takes_the_same_limit_or_none_for_an_existing_organization(flask_cli, issue_key, client):
    issue_key(org="acme", rate_limit=50)
    for extra in (["--rate-limit", "50"], []):
        result = flask_cli("keys", "create", "--org", "acme", *extra)
        assert result.exit_code == 0, result.output
        assert limit_of(client, result.stdout.splitlines()[-1]) == 50


@pytest.mark.both_databases
def test_set_limit_changes_every_key_at_once_and_orgs_list_shows_it(flask_cli, issue_key, client):
    first, second = issue_key(org="acme"), issue_key(org="acme")
    issue_key(org="other", rate_limit=7)
    result = flask_cli("orgs", "set-limit", "acme", "50")
    assert result.exit_code == 0, result.output
    assert "acme" in result.output and "50" in result.output
    assert (limit_of(client, first), limit_of(client, second)) == (50, 50)
    assert [row[:2] for row in rows(flask_cli("orgs", "list"))] == [
        ["SLUG", "RATE_LIMIT_PER_MINUTE"], ["acme", "50"], ["other", "7"]]


def test_set_limit_of_an_unknown_organization_exits_1_naming_it(flask_cli):
    result = flask_cli("orgs", "set-limit", "nobody", "50")
    assert result.exit_code == 1 and "'nobody'" in result.output


@pytest.mark.parametrize("limit", ["0", "1000001", "many"])
def test_set_limit_refuses_a_limit_out_of_bounds_cleanly(flask_cli, issue_key, limit):
    issue_key(org="acme")
    result = flask_cli("orgs", "set-limit", "acme", limit)
    assert result.exit_code == 2 and "PER_MINUTE" in result.output, result.output


@pytest.mark.both_databases
def test_orgs_list_counts_active_keys_live_subscriptions_and_deliveries(
        flask_cli, issue_key, client, app, start_receiver):
    key = issue_key(org="acme")
    revoked = issue_key(org="acme")
    assert flask_cli("keys", "revoke", parse_key(revoked)[0]).exit_code == 0
    issue_key(org="quiet", rate_limit=9)
    failing = start_receiver(script=[500])
    dead = json_of(client.post(WEBHOOKS, json={"url": failing.url}, headers=bearer(key)), 201)
    waiting = json_of(client.post(WEBHOOKS, json={"url": failing.url + "/2"}, headers=bearer(key)), 201)
    gone = json_of(client.post(WEBHOOKS, json={"url": failing.url + "/3"}, headers=bearer(key)), 201)
    for subscription in (dead, gone):
        client.post(f"{WEBHOOKS}/{subscription['id']}/test", json={"secret": subscription["secret"]},
                    headers=bearer(key))
    assert app.extensions["delivery"].run_due() == 2  # no retries: both dead letters
    client.post(f"{WEBHOOKS}/{waiting['id']}/test", json={"secret": waiting["secret"]}, headers=bearer(key))
    assert client.delete(f"{WEBHOOKS}/{gone['id']}", headers=bearer(key)).status_code == 204
    assert rows(flask_cli("orgs", "list")) == [
        ["SLUG", "RATE_LIMIT_PER_MINUTE", "ACTIVE_KEYS", "SUBSCRIPTIONS", "PENDING", "DEAD"],
        ["acme", "600", "1", "2", "1", "1"],
        ["quiet", "9", "1", "0", "0", "0"]]


def test_orgs_list_with_no_organization_prints_the_header(flask_cli):
    assert rows(flask_cli("orgs", "list")) == [
        ["SLUG", "RATE_LIMIT_PER_MINUTE", "ACTIVE_KEYS", "SUBSCRIPTIONS", "PENDING", "DEAD"]]


def test_keys_create_help_lists_the_valid_scopes(flask_cli):
    words = " ".join(flask_cli("keys", "create", "--help").output.split())  # as click wraps it
    assert "identity:read, webhooks:manage" in words and "orgs set-limit" in words


@pytest.mark.parametrize("scope", ["admin:all", "leads:read"])
def test_a_refused_scope_names_the_valid_ones(flask_cli, scope):
    result = flask_cli("keys", "create", "--org", "acme", "--scope", scope)
    assert result.exit_code == 1
    assert f"'{scope}'" in result.output and "identity:read, webhooks:manage" in result.output
    with db.connection_context():
        assert not Organization.select().exists()
