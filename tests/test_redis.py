"""Rate limits on a real Redis server (PARTNER_RATELIMIT_STORAGE_URI=redis://...): the budget of an
organization is exact and shared by every process that serves it.

The tests of test_ratelimit.py run against Redis too (its `config` fixture is parametrized by the
storage); here two apps built by two create_app calls (two serving processes, each with its own
limiter and connection) share one Redis.
"""

import functools
import re
import shutil
import signal
import threading
import time

import pytest

from tests.support import started_app
from partner.edge.ratelimit import PROBE_INTERVAL_SECONDS, storage_options
from tests.servers import start_redis
from tests.support import run_together
from tests.test_ratelimit import get_me


@pytest.fixture
def config(config, redis_url):
    return {"RATELIMIT_STORAGE_URI": redis_url, **config}  # a config marker still wins


@pytest.fixture
def other_client(app, config):
    """A second serving process: its own app, limiter and Redis connection, the same database."""
    return started_app(config).test_client()


def test_the_limiter_counts_in_redis(client, issue_key, redis_server):
    get_me(client, issue_key())
    assert redis_server.client().dbsize() > 0


def test_the_429_carries_every_rate_limit_header(client, issue_key):
    key = issue_key(org="busy", rate_limit=2)
    for _ in range(2):
        get_me(client, key)
    response = get_me(client, key)
    assert response.status_code == 429
    headers = response.headers
    assert (headers["X-RateLimit-Limit"], headers["X-RateLimit-Remaining"]) == ("2", "0")
    assert headers["RateLimit-Policy"] == '"org";q=2;w=60'
    assert re.fullmatch(r'"org";r=0;t=\d+', headers["RateLimit"])
    assert 1 <= int(headers["Retry-After"]) <= 60
    assert int(headers["X-RateLimit-Reset"]) > 0


def test_two_processes_share_one_organization_budget_exactly(client, other_client, issue_key):
    key = issue_key(org="shared", rate_limit=5)
    responses = [get_me(c, key) for c in (client, other_client, client, other_client, client)]
    assert [r.status_code for r in responses] == [200] * 5
    assert [r.headers["X-RateLimit-Remaining"] for r in responses] == ["4", "3", "2", "1", "0"]
    assert get_me(other_client, key).status_code == 429
    assert get_me(client, key).status_code == 429


def test_another_organization_is_unaffected_in_either_process(client, other_client, issue_key):
    busy, calm = issue_key(org="busy", rate_limit=2), issue_key(org="calm", rate_limit=2)
    assert [get_me(c, busy).status_code for c in (client, other_client, client)] == [200, 200, 429]
    assert [get_me(c, calm).status_code for c in (client, other_client)] == [200, 200]


def test_concurrent_requests_in_two_processes_pass_exactly_the_limit(app, config, issue_key):
    key = issue_key(org="racing", rate_limit=25)
    apps = [app, started_app(config)]
    statuses, lock = [], threading.Lock()

    def hammer(serving):
        client = serving.test_client()
        for _ in range(10):
            status = get_me(client, key).status_code
            with lock:
                statuses.append(status)
    assert run_together(*[functools.partial(hammer, apps[n % 2]) for n in range(8)]) == []
    assert sorted(statuses) == [200] * 25 + [429] * 55


@pytest.mark.config(RATELIMIT_STORAGE_URI="memory://")
def test_without_redis_each_process_counts_alone(client, other_client, issue_key):
    """Why scale-out needs Redis: memory:// gives every process a budget of its own."""
    key = issue_key(org="shared", rate_limit=1)
    assert [get_me(c, key).status_code for c in (client, other_client)] == [200, 200]


@pytest.fixture
def own_redis(tmp_path):
    """A Redis server for this test alone, for tests that freeze it: the session's is shared."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed: run scripts/test-services.sh to install it")
    server = start_redis(binary, tmp_path)
    yield server
    server.process.send_signal(signal.SIGCONT)
    server.stop()


def test_a_frozen_redis_costs_no_request_more_than_a_second_and_limits_return(config, own_redis, issue_key,
                                                                              caplog, clock):
    # Its socket timeout well under the second: what a loaded machine adds has room (0.5 s by default).
    client = started_app({**config, "RATELIMIT_STORAGE_URI": own_redis.url(),
                          "RATELIMIT_STORAGE_TIMEOUT": 0.1}).test_client()
    key = issue_key(org="busy", rate_limit=2)
    assert [get_me(client, key).status_code for _ in range(3)] == [200, 200, 429]

    own_redis.process.send_signal(signal.SIGSTOP)  # accepts connections, answers nothing
    for _ in range(9):  # two probe intervals on the service clock: the first request and two probes wait
        started = time.monotonic()
        response = get_me(client, key)
        assert time.monotonic() - started < 1
        assert response.status_code == 200  # served without a limit
        clock.advance(PROBE_INTERVAL_SECONDS / 4)
    own_redis.process.send_signal(signal.SIGCONT)

    clock.advance(PROBE_INTERVAL_SECONDS)  # the next request probes Redis again
    assert get_me(client, key).status_code == 429
    lines = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "partner.edge.ratelimit"]
    assert [level for level, _ in lines] == ["ERROR", "WARNING"], lines
    assert lines[0][1].startswith("rate-limit storage unavailable (TimeoutError: ")
    assert lines[1][1].startswith("rate-limit storage answers again after ")


@pytest.mark.parametrize("uri, options", [
    ("redis://127.0.0.1:6379/0", {"socket_timeout": 0.25, "socket_connect_timeout": 0.25}),
    ("rediss://127.0.0.1:6379/0", {"socket_timeout": 0.25, "socket_connect_timeout": 0.25}),
    ("memory://", {}),
])
def test_redis_storage_gets_socket_timeouts_by_default(uri, options):
    assert storage_options(uri, 0.25) == options
