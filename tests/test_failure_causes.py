"""Why did this delivery fail? Real receivers on 127.0.0.1 that refuse, reset, hang, redirect and serve an
expired certificate, for two organizations: each cause in words in `flask deliveries show`, the same
`error_detail` in the partner's failures audit, and every dead letter in `flask deliveries list --state dead`."""

import socket
import ssl
import struct
from datetime import datetime

import pytest

from tests.receivers import read_request
from tests.support import WEBHOOKS, bearer, free_port, json_of

# One attempt per event: each failure is a dead letter at once. A short deadline for the hanging one, not so
# short that a busy machine makes a refused connection (or a slow TLS handshake) a timeout.
pytestmark = pytest.mark.config(WEBHOOK_ALLOWED_NETWORKS=["127.0.0.0/8"], DELIVERY_RETRY_DELAYS=[],
                                DELIVERY_TIMEOUT=1, AUTO_DISABLE_THRESHOLD=100)

TLS_HOST = "hooks.example.test"


@pytest.fixture
def config(config, ca_bundle):
    return {**config, "DELIVERY_CA_BUNDLE": ca_bundle}


@pytest.fixture
def flask_cli(app):
    runner = app.test_cli_runner()
    return lambda *args: runner.invoke(args=list(args))


def reset(conn, server):
    read_request(conn)
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # closes with RST


@pytest.fixture
def expired_tls(tls_ca) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls_ca.issue_cert(TLS_HOST, not_before=datetime(2020, 1, 1), not_after=datetime(2021, 1, 1)).configure_cert(context)
    return context


ORGANIZATION = {"refused": "acme", "reset": "acme", "redirect": "acme", "hang": "globex", "expired": "globex"}


@pytest.fixture
def fail(client, issue_key, start_receiver, serve_raw, expired_tls, resolver, app, clock):
    """fail(*causes): a subscription per cause, of its ORGANIZATION, each pinged once, a second apart, and its
    one attempt failed: {cause: (subscription, event id, the partner's auth header)}. A test asks only for
    the causes it reads: the hang waits out the deadline."""
    headers = {org: bearer(issue_key(org=org)) for org in set(ORGANIZATION.values())}
    resolver.answers[TLS_HOST] = ["127.0.0.1"]

    def redirecting() -> str:
        receiver = start_receiver(script=[302])
        receiver.redirect_to = "https://hooks.partner.example/moved?token=s3cret"
        return receiver.url

    urls = {
        "refused": lambda: f"http://127.0.0.1:{free_port()}/hook",
        "reset": lambda: serve_raw(reset).url,
        "redirect": redirecting,
        "hang": lambda: serve_raw(lambda conn, server: server.stopped.wait()).url,
        "expired": lambda: start_receiver(tls=expired_tls).url_for(TLS_HOST),
    }

    def fail(*causes) -> dict:
        made = {}
        for cause in causes:
            auth = headers[ORGANIZATION[cause]]
            subscription = json_of(client.post(WEBHOOKS, json={"url": urls[cause]()}, headers=auth), 201)
            event = json_of(client.post(f"{WEBHOOKS}/{subscription['id']}/test",
                                        json={"secret": subscription["secret"]}, headers=auth), 202)
            made[cause] = (subscription, event["id"], auth)
            clock.advance(1)
        assert app.extensions["delivery"].run_due() == len(causes)
        return made
    return fail


CAUSES = {  # cause: (error, the words of error_detail)
    "refused": ("connection_error", "connection refused by 127.0.0.1 port "),
    "reset": ("connection_error", "connection reset by the receiver while waiting for the response head"),
    "redirect": ("redirect", "302 to https://hooks.partner.example/moved?…"),
    "hang": ("timeout", "deadline of 1 s reached while waiting for the response head"),
    "expired": ("tls_error", "certificate verify failed: certificate has expired"),
}


@pytest.mark.parametrize("cause", CAUSES)
def test_the_partners_failures_audit_names_the_cause(client, fail, cause):
    subscription, event_id, headers = fail(cause)[cause]
    [record] = json_of(client.get(f"{WEBHOOKS}/{subscription['id']}/failures", headers=headers), 200)["data"]
    error, words = CAUSES[cause]
    assert (record["event_id"], record["error"], record["next_attempt_at"]) == (event_id, error, None)
    assert record["error_detail"].startswith(words) and len(record["error_detail"]) <= 200
    assert "s3cret" not in record["error_detail"]


@pytest.mark.parametrize("cause", CAUSES)
def test_deliveries_show_names_the_cause_and_why_it_ended(client, flask_cli, fail, cause):
    subscription, event_id, headers = fail(cause)[cause]
    [record] = client.get(f"{WEBHOOKS}/{subscription['id']}/failures", headers=headers).get_json()["data"]
    result = flask_cli("deliveries", "show", event_id)
    assert result.exit_code == 0, result.output
    head, table = result.stdout.split("\n\n")
    fields = dict(line.split(":", 1) for line in head.splitlines())
    assert {name: value.strip() for name, value in fields.items()} == {
        "event": event_id, "kind": "vc.test.ping", "created_at": fields["created_at"].strip(),
        "subscription": f"{subscription['id']} (active)",
        "organization": ORGANIZATION[cause],
        "url": subscription["url"], "state": "dead",
        "ended": "retries exhausted: attempt 1 failed, the last the retry schedule allows"}
    header, row = [line.split("\t") for line in table.splitlines()]
    assert header == ["ATTEMPT", "ATTEMPTED_AT", "OUTCOME", "HTTP_STATUS", "ERROR", "ERROR_DETAIL", "DURATION_MS",
                      "EXCERPT"]
    assert row[:3] == ["1", record["attempted_at"], "failed"]
    assert row[4:7] == [CAUSES[cause][0], record["error_detail"], str(record["duration_ms"])]


def test_deliveries_list_dead_lists_them_across_both_organizations_newest_first(flask_cli, fail):
    failed = fail(*CAUSES)
    header, *rows = [line.split("\t") for line in flask_cli("deliveries", "list", "--state", "dead").stdout.splitlines()]
    assert header == ["EVENT_ID", "SUBSCRIPTION", "ORG", "KIND", "STATE", "ATTEMPTS", "CREATED_AT",
                      "DUE_OR_FINISHED_AT"]
    newest_first = [(event_id, subscription["id"], ORGANIZATION[cause])
                    for cause, (subscription, event_id, _) in reversed(failed.items())]
    assert [tuple(row[:3]) for row in rows] == newest_first
    assert all(row[3:6] == ["vc.test.ping", "dead", "1"] for row in rows)
    globex = flask_cli("deliveries", "list", "--state", "dead", "--org", "globex").stdout.splitlines()[1:]
    assert sorted(line.split("\t")[0] for line in globex) == sorted([failed["hang"][1], failed["expired"][1]])
