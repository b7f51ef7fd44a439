"""PostgreSQL stopped under a serving process: every endpoint answers 503 problem+json with Retry-After,
nothing is changed, and once the server is back the same process serves again.

The server is this test's own (`own_postgres_server`): the session's is shared by every PostgreSQL test.
"""

import time

import pytest

from tests.support import ME, WEBHOOKS
from tests.test_faults import NEW, assert_unavailable


@pytest.fixture
def database_url(own_postgres_server):
    return own_postgres_server.url(own_postgres_server.create_schema())


def every_endpoint(client, auth, subscription):
    sid = subscription["id"]
    return {
        "GET /me": lambda: client.get(ME, headers=auth),
        "GET /webhooks": lambda: client.get(WEBHOOKS, headers=auth),
        "POST /webhooks": lambda: client.post(WEBHOOKS, json=NEW, headers=auth),
        "DELETE /webhooks/{id}": lambda: client.delete(f"{WEBHOOKS}/{sid}", headers=auth),
        "POST /webhooks/{id}/test": lambda: client.post(f"{WEBHOOKS}/{sid}/test",
                                                        json={"secret": subscription["secret"]},
                                                        headers=auth),
        "GET /webhooks/{id}/failures": lambda: client.get(f"{WEBHOOKS}/{sid}/failures", headers=auth),
    }


def test_postgresql_stopped_is_503_everywhere_and_the_same_process_serves_after_restart(
        own_postgres_server, client, auth):
    subscription = client.post(WEBHOOKS, json=NEW, headers=auth).get_json()
    endpoints = every_endpoint(client, auth, subscription)
    assert client.get(ME, headers=auth).status_code == 200  # pooled connections now exist

    own_postgres_server.pause()
    for name, request in endpoints.items():
        started = time.monotonic()
        assert_unavailable(request())
        assert time.monotonic() - started < 2, name

    own_postgres_server.resume()
    assert client.get(ME, headers=auth).status_code == 200
    listed = client.get(WEBHOOKS, headers=auth).get_json()["data"]
    assert [row["id"] for row in listed] == [subscription["id"]]  # nothing was changed meanwhile
    assert client.get(f"{WEBHOOKS}/{subscription['id']}/failures", headers=auth).get_json()["data"] == []
