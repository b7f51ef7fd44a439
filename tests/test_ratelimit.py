"""The per-organization budget: exactly N requests in any 60 s, shared by the organization's keys."""

import pytest

from tests.support import ME, bearer


@pytest.fixture(params=["memory", "redis"])
def config(request, config):
    """Every test here runs on both rate-limit storages: in-process windows and a real Redis."""
    if request.param == "redis":
        config.setdefault("RATELIMIT_STORAGE_URI", request.getfixturevalue("redis_url"))
    return config


def get_me(client, key):
    return client.get(ME, headers=bearer(key))


def test_the_601st_request_of_an_organization_gets_429(client, issue_key):
    key = issue_key(org="busy")
    statuses = [get_me(client, key).status_code for _ in range(600)]
    assert statuses == [200] * 600
    response = get_me(client, key)
    assert response.status_code == 429
    assert response.get_json()["code"] == "rate_limited"
    assert response.content_type == "application/problem+json"
    assert 1 <= int(response.headers["Retry-After"]) <= 60
    assert response.headers["X-RateLimit-Remaining"] == "0"


def test_another_organization_is_unaffected(client, issue_key):
    busy, calm = issue_key(org="busy", rate_limit=3), issue_key(org="calm", rate_limit=3)
    for _ in range(3):
        get_me(client, busy)
    assert get_me(client, busy).status_code == 429
    assert get_me(client, calm).status_code == 200


def test_two_keys_of_one_organization_share_the_budget(client, issue_key):
    first, second = issue_key(org="shared", rate_limit=4), issue_key(org="shared")
    assert [get_me(client, k).status_code for k in (first, second, first, second)] == [200] * 4
    assert get_me(client, second).status_code == 429
    assert get_me(client, first).status_code == 429


def test_retry_after_only_on_429(client, issue_key):
    key = issue_key(rate_limit=1)
    assert "Retry-After" not in get_me(client, key).headers
    assert "Retry-After" in get_me(client, key).headers


def test_failed_authentication_never_spends_the_organization_budget(client, issue_key):
    key = issue_key(org="target", rate_limit=2)
    wrong = key[:-1] + ("A" if key[-1] != "A" else "B")
    for _ in range(10):
        assert get_me(client, wrong).status_code == 401
    assert get_me(client, key).get_json()["rate_limit_remaining"] == 1


def test_failed_authentications_are_limited_per_client_address(app, client):
    app.extensions["rate_limits"].auth_failures_per_minute = 3
    statuses = [client.get(ME).status_code for _ in range(4)]
    assert statuses == [401, 401, 401, 429]
    other = client.get(ME, environ_base={"REMOTE_ADDR": "127.0.0.9"})
    assert other.status_code == 401


def test_an_unreachable_storage_fails_open(config, issue_key):
    from tests.support import started_app
    config["RATELIMIT_STORAGE_URI"] = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    client = started_app(config).test_client()
    key = issue_key()  # the key lives in the same database file
    response = get_me(client, key)
    assert response.status_code == 200
    assert response.get_json()["rate_limit_remaining"] == 600


def test_a_limit_the_operator_lowers_counts_what_the_window_already_holds(client, issue_key, app):
    key = issue_key(org="acme")
    for _ in range(5):
        assert get_me(client, key).status_code == 200
    assert app.test_cli_runner().invoke(args=["orgs", "set-limit", "acme", "3"]).exit_code == 0
    response = get_me(client, key)
    # On both storages: a window is the organization's, whatever its limit (none remains, never fewer).
    assert (response.status_code, response.headers["X-RateLimit-Limit"], response.headers["X-RateLimit-Remaining"]) \
        == (429, "3", "0")
    assert response.headers["RateLimit"].startswith('"org";r=0;')


def test_a_local_window_passes_exactly_the_limit_in_any_60_seconds(clock):
    from partner.edge.ratelimit import LocalWindows
    clock.now = 1_000_000  # whole seconds: the window edge is compared exactly
    windows = LocalWindows(clock)
    allowed = []
    for _ in range(4):
        allowed.append(windows.hit("org", "a", 3).allowed)
        clock.advance(10)
    assert allowed == [True, True, True, False]
    clock.advance(19)  # 59 s after the first hit: still inside its window
    assert not windows.hit("org", "a", 3).allowed
    clock.advance(1)
    window = windows.hit("org", "a", 3)
    assert (window.allowed, window.remaining, window.reset_at) == (True, 0, clock() - 50 + 60)


def test_a_local_window_after_a_lowered_limit_resets_when_a_request_would_pass(clock):
    from partner.edge.ratelimit import LocalWindows
    clock.now = 1_000_000
    windows = LocalWindows(clock)
    for _ in range(5):
        windows.hit("org", "a", 10)
        clock.advance(1)
    window = windows.hit("org", "a", 2)  # the operator lowered the limit: 5 counted, 1 may stay
    assert (window.allowed, window.remaining, window.reset_at) == (False, 0, 1_000_003 + 60)
    clock.now = window.reset_at - 0.001
    assert not windows.hit("org", "a", 2).allowed
    clock.now = window.reset_at
    assert windows.hit("org", "a", 2).allowed


@pytest.mark.parametrize("config", ["memory"], indirect=True)
def test_a_spent_budget_returns_when_the_service_clock_passes_its_window(client, issue_key, clock):
    key = issue_key(org="stepped", rate_limit=2)
    assert [get_me(client, key).status_code for _ in range(2)] == [200, 200]
    refused = get_me(client, key)
    assert (refused.status_code, refused.headers["Retry-After"]) == (429, "60")
    clock.advance(59)
    assert get_me(client, key).headers["Retry-After"] == "1"
    clock.advance(1)
    response = get_me(client, key)
    assert response.status_code == 200
    assert response.get_json()["rate_limit_remaining"] == 1  # the two first left the window together


@pytest.mark.parametrize("config", ["memory"], indirect=True)
def test_a_failed_authentication_budget_returns_when_the_service_clock_passes_its_window(app, client, clock):
    app.extensions["rate_limits"].auth_failures_per_minute = 1
    assert [client.get(ME).status_code for _ in range(2)] == [401, 429]
    clock.advance(60)
    assert client.get(ME).status_code == 401


def test_a_local_window_forgets_idle_budgets(clock):
    from partner.edge.ratelimit import LocalWindows
    windows = LocalWindows(clock)
    windows.hit("org", "idle", 10)
    clock.advance(61)
    windows.hit("org", "busy", 10)
    assert windows.hit("org", "idle", 10).remaining == 9  # a fresh budget, not a stale one
    assert len(windows._hits) == 2
    clock.advance(61)
    windows.hit("org", "busy", 10)
    assert list(windows._hits) == [("org", "busy")]


def failed_logins(client, forwarded_for: str, times: int, environ: dict | None = None) -> list[int]:
    """Statuses of `times` unauthenticated requests, as a proxy (at 127.0.0.1, unless `environ`
    names another REMOTE_ADDR) would forward them."""
    return [client.get(ME, headers={"X-Forwarded-For": forwarded_for}, environ_base=environ or {}).status_code
            for _ in range(times)]


@pytest.mark.config(TRUSTED_PROXIES=1)
def test_behind_a_trusted_proxy_each_client_has_its_own_failed_authentication_budget(app, client):
    app.extensions["rate_limits"].auth_failures_per_minute = 3
    assert failed_logins(client, "203.0.113.1", 4) == [401, 401, 401, 429]
    assert failed_logins(client, "203.0.113.2", 1) == [401]
    # A client's own X-Forwarded-For comes before what the proxy appends: it is not believed.
    assert failed_logins(client, "198.51.100.7, 203.0.113.1", 1) == [429]


def test_without_a_trusted_proxy_x_forwarded_for_cannot_buy_a_fresh_budget(app, client):
    app.extensions["rate_limits"].auth_failures_per_minute = 3
    statuses = [failed_logins(client, f"203.0.113.{n}", 1)[0] for n in range(4)]
    assert statuses == [401, 401, 401, 429]


@pytest.mark.config(TRUSTED_PROXIES=1)
def test_a_client_outside_the_trusted_proxy_addresses_cannot_choose_its_address(app, client):
    """A client reaching the service without the proxy writes X-Forwarded-For itself: it is
    ignored, and every failure counts against the client's own address."""
    app.extensions["rate_limits"].auth_failures_per_minute = 3
    outsider = {"REMOTE_ADDR": "198.51.100.20"}
    statuses = [client.get(ME, headers={"X-Forwarded-For": f"203.0.113.{n}"}, environ_base=outsider).status_code
                for n in range(6)]
    assert statuses == [401, 401, 401, 429, 429, 429]
    assert client.get(ME, environ_base=outsider).status_code == 429  # without the header: the same budget


@pytest.mark.config(TRUSTED_PROXIES=1, TRUSTED_PROXY_ADDRESSES=["10.0.0.5/32", "::1/128"])
@pytest.mark.parametrize("proxy", ["10.0.0.5", "::ffff:10.0.0.5", "::1"])
def test_a_proxy_in_the_trusted_addresses_is_believed(app, client, proxy):
    app.extensions["rate_limits"].auth_failures_per_minute = 1
    from_proxy = {"REMOTE_ADDR": proxy}
    assert failed_logins(client, "203.0.113.1", 2, from_proxy) == [401, 429]
    assert failed_logins(client, "203.0.113.2", 1, from_proxy) == [401]


@pytest.mark.config(TRUSTED_PROXIES=1, TRUSTED_PROXY_ADDRESSES=["10.0.0.5/32"])
def test_loopback_is_not_trusted_once_the_addresses_name_another_proxy(app, client):
    app.extensions["rate_limits"].auth_failures_per_minute = 1
    assert failed_logins(client, "203.0.113.1", 1) == [401]
    assert failed_logins(client, "203.0.113.2", 1) == [429]  # both counted against 127.0.0.1


@pytest.mark.config(TRUSTED_PROXIES=1)
@pytest.mark.parametrize("forwarded", ["x" * 6000, "not-an-address", "203.0.113.1 <script>", "::g"])
def test_a_forwarded_address_that_is_no_address_is_not_believed(app, client, forwarded, caplog):
    app.extensions["rate_limits"].auth_failures_per_minute = 2
    # Each counts against the proxy's own address (loopback), never a text the header chose.
    assert failed_logins(client, forwarded, 2) + failed_logins(client, "x" + forwarded, 1) == [401, 401, 429]
