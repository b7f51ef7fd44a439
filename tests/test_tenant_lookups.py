"""One organization's names that never answer leave another organization's creates quick and its
deliveries whole (partner/outbound/dns.py), through a real gunicorn (one worker, 8 request threads,
its delivery scanner) serving bench/stub_dns_app.py: its names under dead.bench.test stop answering
for good, as behind a lame delegation, once a flag file exists; every other *.bench.test is 127.0.0.1."""

import threading
import time

import pytest
import requests

from tests.gunicorn_server import STOP_SECONDS, Gunicorn, Partner, flask
from tests.support import bearer, eventually, open_database

CREATES_IN_FLIGHT = 12
# More than release 1.2's 32 delivery lookup threads: their attempts' lookups would take every one.
LAME_SUBSCRIPTIONS = 40
PARTNER_CREATES = 10
ANSWERED_AT_ONCE = 0.1  # seconds: a refusal this quick is followed by a pause, as a client would


@pytest.fixture
def stub_dns(server_env, tmp_path, session):
    """(a Partner per organization of the running service, the flag file that kills the dead names)."""
    flag = tmp_path / "dns-dead"
    server_env.update(BENCH_DNS_DEAD_FLAG=str(flag), PARTNER_WEBHOOK_ALLOWED_NETWORKS='["127.0.0.0/8"]',
                      PARTNER_DELIVERY_TIMEOUT="2")
    open_database(server_env["PARTNER_DATABASE_URL"]).close_all()  # as the service's first start makes it
    keys = {org: flask(server_env, "keys", "create", "--org", org, "--scope", "webhooks:manage",
                       "--rate-limit", "100000") for org in ("attacker", "partner")}
    server = Gunicorn(server_env, tmp_path / "gunicorn", "bench.stub_dns_app:app")
    try:
        server.wait_until_serving(session)
        yield {org: Partner(server.base_url, key) for org, key in keys.items()}, flag
    finally:
        server.process.kill()
        server.process.wait(timeout=STOP_SECONDS)


def test_names_that_never_answer_leave_another_organizations_creates_and_deliveries_alone(
        stub_dns, start_receiver):
    partners, flag = stub_dns
    attacker, partner = partners["attacker"], partners["partner"]
    receiver = start_receiver()
    lame = [attacker.create(receiver.url_for(f"a{n}.dead.bench.test")).json() for n in range(LAME_SUBSCRIPTIONS)]
    flag.touch()  # the attacker's names answer no more
    for subscription in lame:
        attacker.ping(subscription)
    stop, answers = threading.Event(), []

    def keep_creating(n: int) -> None:  # on a session of its own (Partner: one per thread)
        while not stop.is_set():
            started = time.monotonic()
            answers.append(attacker.create(receiver.url_for(f"c{n}.dead.bench.test")))
            if time.monotonic() - started < ANSWERED_AT_ONCE:
                stop.wait(ANSWERED_AT_ONCE)

    creators = [threading.Thread(target=keep_creating, args=(n,)) for n in range(CREATES_IN_FLIGHT)]
    for creator in creators:
        creator.start()
    try:
        assert eventually(lambda: len(answers) >= CREATES_IN_FLIGHT)  # each thread's first is over
        took, created = [], []
        for n in range(PARTNER_CREATES):
            started = time.monotonic()
            response = partner.create(receiver.url_for(f"b{n}.bench.test"))
            took.append(time.monotonic() - started)
            assert response.status_code == 201, response.text
            created.append(response.json())
        assert max(took) < 1
        events = {partner.ping(subscription) for subscription in created}
        assert eventually(lambda: events <= {r.headers["X-VC-Event-Id"] for r in receiver.received}, seconds=10)
    finally:
        stop.set()
        for creator in creators:
            creator.join()
    assert all(partner.get(f"/{s['id']}/failures")["data"] == [] for s in created)
    assert {s["consecutive_failures"] for s in partner.get("?limit=100")["data"]} == {0}
    refused = [a for a in answers if a.status_code == 503]
    assert {a.json()["code"] for a in refused} == {"service_unavailable"}
    assert {a.status_code for a in answers} <= {422, 503} and all(a.headers["Retry-After"] for a in refused)


def test_two_organizations_creating_on_dead_names_and_a_publisher_leave_a_third_its_threads(
        stub_dns, start_receiver, server_env):
    partners, flag = stub_dns
    base_url = partners["partner"].base_url
    second = Partner(base_url, flask(server_env, "keys", "create", "--org", "attacker2", "--scope", "webhooks:manage",
                                     "--rate-limit", "100000"))
    flask(server_env, "event-types", "add", "lead.created")
    credential = flask(server_env, "publishers", "create", "crm")
    receiver = start_receiver()
    flag.touch()  # every *.dead.bench.test name answers no more
    stop, answers = threading.Event(), []

    def keep_creating(attacker: Partner, n: int) -> None:
        while not stop.is_set():
            started = time.monotonic()
            answers.append(attacker.create(receiver.url_for(f"c{n}.dead.bench.test")).status_code)
            if time.monotonic() - started < ANSWERED_AT_ONCE:
                stop.wait(ANSWERED_AT_ONCE)

    def keep_publishing() -> None:
        with requests.Session() as http:
            http.trust_env = False
            batch = {"events": [{"organization": "partner", "event": "lead.created", "data": {"n": n}} for n in range(500)]}
            while not stop.is_set():
                answers.append(http.post(base_url + "/internal/v1/events/batch", json=batch, timeout=30,
                                         headers=bearer(credential)).status_code)
    busy = [threading.Thread(target=keep_creating, args=(attacker, n))
            for attacker in (partners["attacker"], second) for n in range(6)] + [threading.Thread(target=keep_publishing)]
    for thread in busy:
        thread.start()
    partner, took = partners["partner"], []
    try:
        assert eventually(lambda: len(answers) >= 12)
        for n in range(PARTNER_CREATES):
            for call in (lambda: partner.http.get(base_url + "/api/v1/partner/me", timeout=10),
                         lambda: partner.create(receiver.url_for(f"live{n}.bench.test"))):
                started = time.monotonic()
                response = call()
                took.append(time.monotonic() - started)
                assert response.status_code in (200, 201), response.text
    finally:
        stop.set()
        for thread in busy:
            thread.join()
    assert max(took) < 1, took  # bench/: the p99; here, that none waited for a thread
    assert set(answers) <= {202, 422, 503}
