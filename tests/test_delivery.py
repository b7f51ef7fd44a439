"""End-to-end delivery: real receivers on 127.0.0.1, the clock stepped, the queue stepped with run_due()."""

import dataclasses
import functools
import gzip
import json
import socket
import sqlite3
import time

import pytest

from partner import safe_text
import signing
from partner.outbox import claim_due
from models import Delivery, Failure, Subscription, db
from tests.receivers import Receiver, drip, drip_bytes, hang, read_request
from partner.timestamps import iso
from partner.outbound.sockets import SocketsBusy
from partner.outbound.dns import LookupsBusy
from tests.support import (SLACK_SECONDS, WEBHOOKS, bearer, counting_scans, delivery_of, eventually, field_codes,
                           json_of, ping_as)

DAY = 86400


@pytest.fixture
def config(config, ca_bundle):
    config.setdefault("WEBHOOK_ALLOWED_NETWORKS", ["127.0.0.0/8"])
    config.setdefault("DELIVERY_CA_BUNDLE", ca_bundle)  # partners' certificates come from the test CA
    return config


@pytest.fixture
def failing(receiver, subscribe) -> dict:
    """A subscription whose receiver answers every delivery with 500."""
    receiver.script = [500]
    return subscribe(receiver.url)


@pytest.fixture
def failed_attempt(dispatcher, ping, failures):
    def failed_attempt(subscription: dict) -> dict:
        """Ping, make the attempt, and return its failure record (the only one)."""
        ping(subscription)
        dispatcher.run_due()
        [record] = failures(subscription)["data"]
        return record
    return failed_attempt


@pytest.fixture
def listed(client, auth):
    def listed(subscription: dict) -> dict:
        rows = client.get(WEBHOOKS, headers=auth).get_json()["data"]
        return next(row for row in rows if row["id"] == subscription["id"])
    return listed


def subscribe_stalled(resolver, subscribe, receiver, name: str) -> dict:
    """A subscription to `name` at `receiver`: its DNS answers 127.0.0.1 at create time, then stalls."""
    resolver.answers[name] = ["127.0.0.1"]
    subscription = subscribe(receiver.url_for(name))
    resolver.stalled.add(name)
    return subscription


def seconds_taken(action) -> float:
    started = time.monotonic()
    action()
    return time.monotonic() - started


def run_for(dispatcher, clock, seconds: float, step: float = 3600) -> None:
    """Let `seconds` of service time pass, running whatever falls due along the way."""
    for _ in range(int(seconds // step) + 1):
        dispatcher.run_due()
        clock.advance(step)
    dispatcher.run_due()


@pytest.mark.both_databases
def test_ping_arrives_signed_and_verifiable(dispatcher, receiver, subscribe, ping, clock, api_key):
    subscription = subscribe(receiver.url)
    accepted = ping(subscription).get_json()
    assert dispatcher.run_due() == 1
    [request] = receiver.received
    now_ms = int(clock() * 1000)
    signing.verify(request.headers, request.body, subscription["secret"], now_ms=now_ms)
    signing.verify_standard(request.headers, request.body, subscription["secret"], now_s=now_ms // 1000)
    assert request.headers["webhook-id"] == accepted["id"]
    assert int(request.headers["webhook-timestamp"]) == int(request.headers["X-VC-Timestamp"]) // 1000
    envelope = json.loads(request.body)
    assert envelope == {
        "event": "vc.test.ping", "id": accepted["id"], "subscription_id": subscription["id"],
        "occurred_at": envelope["occurred_at"],
        "data": {"message": envelope["data"]["message"], "triggered_by_key_id": api_key[4:].split(".")[0]},
    }
    assert request.path == "/hook"
    assert request.headers["Content-Type"] == "application/json"
    assert request.headers["User-Agent"] == "PartnerWebhooks/1.0"
    assert (request.headers["X-VC-Event"], request.headers["X-VC-Event-Id"],
            request.headers["X-VC-Attempt"]) == ("vc.test.ping", accepted["id"], "1")


def test_the_body_is_compact_json(dispatcher, receiver, subscribe, ping):
    ping(subscribe(receiver.url))
    dispatcher.run_due()
    body = receiver.received[0].body
    assert body == json.dumps(json.loads(body), separators=(",", ":"), ensure_ascii=False).encode()


def test_seven_attempts_with_the_same_id_and_bytes_then_nothing(dispatcher, receiver, failing, ping,
                                                                  clock, failures):
    ping(failing)
    run_for(dispatcher, clock, 3 * DAY)
    assert len(receiver.received) == 7
    assert len({r.body for r in receiver.received}) == 1
    assert len({r.headers["X-VC-Event-Id"] for r in receiver.received}) == 1
    assert [r.headers["X-VC-Attempt"] for r in receiver.received] == [str(n) for n in range(1, 8)]
    records = failures(failing, limit=100)["data"]
    assert [f["attempt"] for f in records] == [7, 6, 5, 4, 3, 2, 1]
    assert all(f["http_status"] == 500 and f["error"] == "http_status" for f in records)
    assert records[0]["next_attempt_at"] is None
    assert all(f["next_attempt_at"] for f in records[1:])


@pytest.mark.parametrize("attempt, delay", [(1, 60), (2, 300), (3, 1800), (4, 7200), (5, 21600), (6, 86400)])
def test_retries_follow_the_schedule(dispatcher, receiver, subscribe, ping, clock, attempt, delay):
    receiver.script = [500]
    ping(subscribe(receiver.url))
    for _ in range(attempt - 1):
        dispatcher.run_due()
        clock.advance(DAY * 1.2)
    dispatcher.run_due()
    assert len(receiver.received) == attempt
    clock.advance(delay - 0.01)
    assert dispatcher.run_due() == 0
    clock.advance(delay * 0.1 + 0.02)  # the largest jitter is 10 %
    assert dispatcher.run_due() == 1


@pytest.mark.both_databases
def test_failure_record_fields(dispatcher, receiver, subscribe, ping, clock, failures):
    receiver.script = [503]
    subscription = subscribe(receiver.url)
    event_id = ping(subscription).get_json()["id"]
    dispatcher.run_due()
    [record] = failures(subscription)["data"]
    assert set(record) == {"id", "event_id", "event", "attempt", "http_status", "error", "error_detail",
                           "response_excerpt", "duration_ms", "attempted_at", "next_attempt_at"}
    assert (record["event_id"], record["event"], record["attempt"], record["http_status"], record["error"],
            record["error_detail"], record["response_excerpt"]) == (event_id, "vc.test.ping", 1, 503, "http_status",
                                                                    None, "ok")
    assert record["duration_ms"] >= 0


@pytest.mark.both_databases
def test_success_after_failures_resets_the_counter(dispatcher, receiver, subscribe, ping, clock, listed):
    receiver.script = [500, 502, 204]
    subscription = subscribe(receiver.url)
    ping(subscription)
    dispatcher.run_due()
    clock.advance(70)
    dispatcher.run_due()
    assert listed(subscription)["consecutive_failures"] == 2
    clock.advance(400)
    dispatcher.run_due()
    assert len(receiver.received) == 3
    assert listed(subscription)["consecutive_failures"] == 0


@pytest.mark.config(DELIVERY_TIMEOUT=0.5)
@pytest.mark.parametrize("step", [hang(60), drip(60)], ids=["silent", "slow-drip"])
def test_timeout_and_slow_drip_end_at_the_deadline(dispatcher, receiver, subscribe, ping, failures, step):
    subscription = subscribe(receiver.url)
    receiver.script = [step]
    ping(subscription)
    assert 0.5 <= seconds_taken(dispatcher.run_due) < 0.5 + SLACK_SECONDS  # not the minute it would last
    [record] = failures(subscription)["data"]
    assert record["error"] == "timeout"
    assert 500 <= record["duration_ms"] < (0.5 + SLACK_SECONDS) * 1000


def test_redirect_is_recorded_and_not_followed(failed_attempt, dispatcher, subscribe, ping, failures):
    source, elsewhere = Receiver(script=[302]).start(), Receiver().start()
    try:
        source.redirect_to = elsewhere.url
        subscription = subscribe(source.url)
        record = failed_attempt(subscription)
        assert (record["error"], record["http_status"]) == ("redirect", 302)
        assert elsewhere.received == []
    finally:
        source.stop()
        elsewhere.stop()


@pytest.mark.both_databases
def test_twenty_consecutive_failures_auto_disable(dispatcher, receiver, failing, ping, clock,
                                                  listed, failures):
    for _ in range(3):  # 3 events x 7 attempts = 21 > 20
        assert ping(failing).status_code == 202
    run_for(dispatcher, clock, 3 * DAY)
    assert len(receiver.received) == 20
    state = listed(failing)
    assert (state["active"], state["consecutive_failures"]) == (False, 20)
    assert state["auto_disabled_at"] is not None
    assert len(failures(failing, limit=100)["data"]) == 20
    response = ping(failing)
    assert response.status_code == 409
    assert response.get_json()["code"] == "subscription_disabled"


@pytest.mark.both_databases
def test_delete_stops_retries(dispatcher, receiver, failing, ping, clock, client, auth):
    ping(failing)
    dispatcher.run_due()
    assert client.delete(f"{WEBHOOKS}/{failing['id']}", headers=auth).status_code == 204
    run_for(dispatcher, clock, 3 * DAY)
    assert len(receiver.received) == 1


@pytest.mark.parametrize("limit", [1, 2, 3, 5, 20, 100])
@pytest.mark.both_databases
def test_failure_pages_return_every_failure_exactly_once(dispatcher, receiver, failing, ping, clock,
                                                         failures, limit):
    ping(failing)
    ping(failing)  # two events fail in the same instant: ties on attempted_at
    run_for(dispatcher, clock, 3 * DAY)
    every = failures(failing, limit=100)["data"]
    assert len(every) == 14
    seen, cursor = [], None
    while True:
        page = failures(failing, limit=limit, **({"cursor": cursor} if cursor else {}))
        assert len(page["data"]) <= limit
        seen += [f["id"] for f in page["data"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == [f["id"] for f in every]
    assert [f["attempted_at"] for f in every] == sorted((f["attempted_at"] for f in every), reverse=True)


@pytest.mark.config(WEBHOOK_ALLOWED_NETWORKS=["127.0.0.1/32"])
def test_dns_rebinding_to_an_internal_address_fails_without_connecting(failed_attempt, resolver, dispatcher, subscribe,
                                                                       ping, failures):
    internal = Receiver(host="127.0.0.2").start()
    try:
        resolver.answers["rebind.partner.example"] = ["93.184.215.14"]
        subscription = subscribe(f"http://rebind.partner.example:{internal.server.server_port}/hook")
        resolver.answers["rebind.partner.example"] = ["127.0.0.2"]
        record = failed_attempt(subscription)
        assert (record["error"], record["http_status"]) == ("internal_url", None)
        assert record["error_detail"] == ("127.0.0.2 (rebind.partner.example) is in 127.0.0.0/8: an internal "
                                          "address, never delivered to")
        assert internal.received == []
    finally:
        internal.stop()


@pytest.mark.config(WEBHOOK_ALLOWED_NETWORKS=["127.0.0.1/32"])
@pytest.mark.config(SCHEDULER_ENABLED=True, DELIVERY_TIMEOUT=60, DELIVERY_CONCURRENCY=4)
def test_subscriptions_whose_last_attempt_failed_hold_at_most_half_the_slots(app, dispatcher, subscribe, ping):
    """The slow receiver answers nothing until the test ends: had the failing subscriptions taken
    every slot, nothing would reach the fast one."""
    slow, fast = Receiver(script=[hang(60)]).start(), Receiver().start()
    try:
        failing = [subscribe(slow.url) for _ in range(4)]
        with app.app_context(), db.connection_context():
            Subscription.update(consecutive_failures=1).execute()  # each failed its last attempt
        for subscription in failing:
            ping(subscription)
        dispatcher.start()
        assert slow.wait_for(2)
        for subscription in [subscribe(fast.url) for _ in range(4)]:
            ping(subscription)
        assert fast.wait_for(4)
        assert len(slow.received) == 2  # the other two wait for a failing slot
    finally:
        slow.stop()
        fast.stop()


@pytest.mark.config(WEBHOOK_ALLOWED_NETWORKS=["127.0.0.1/32"])
def test_a_name_rebound_to_an_internal_address_is_refused_though_a_connection_to_it_is_kept(failed_attempt, 
        resolver, server_tls, dispatcher, subscribe, ping, failures):
    partner = Receiver(tls=server_tls).start()
    try:
        resolver.answers["hooks.partner.example"] = ["127.0.0.1"]
        subscription = subscribe(partner.url_for("hooks.partner.example"))
        ping(subscription)
        ping(subscription)
        assert dispatcher.run_due() == 2
        assert (len(partner.received), partner.connections) == (2, 1)  # one connection, kept alive
        resolver.answers["hooks.partner.example"] = ["127.0.0.2"]
        record = failed_attempt(subscription)
        assert (record["error"], record["http_status"]) == ("internal_url", None)
        assert len(partner.received) == 2
    finally:
        partner.stop()


@pytest.mark.config(DELIVERY_TIMEOUT=0.5)
def test_a_lookup_that_does_not_answer_in_time_is_a_timeout_lasting_the_deadline(
        resolver, receiver, subscribe, ping, dispatcher, failures):
    subscription = subscribe_stalled(resolver, subscribe, receiver, "slow.partner.example")
    ping(subscription)
    elapsed = seconds_taken(dispatcher.run_due)
    [record] = failures(subscription)["data"]
    assert (record["error"], record["http_status"]) == ("timeout", None)
    assert record["error_detail"] == "deadline of 0.5 s reached while resolving the host name"
    assert 500 <= record["duration_ms"] < (0.5 + SLACK_SECONDS) * 1000
    assert 0.5 <= elapsed < 0.5 + SLACK_SECONDS  # the stalled lookup answers only when the test ends
    assert receiver.received == []


@pytest.mark.config(DELIVERY_TIMEOUT=1)
def test_the_lookup_counts_against_the_attempts_deadline(resolver, subscribe, ping, dispatcher, failures):
    slow = Receiver(script=[hang(60)]).start()
    transport, left_for_the_post = dispatcher.courier.sender.transport, []

    def post(target, body, headers, deadline):
        left_for_the_post.append(deadline.remaining())
        return type(transport).post(transport, target, body, headers, deadline)

    transport.post = post
    try:
        resolver.answers["late.partner.example"] = ["127.0.0.1"]
        subscription = subscribe(slow.url_for("late.partner.example"))
        resolver.slow["late.partner.example"] = 0.3  # of the attempt's 1 s
        ping(subscription)
        elapsed = seconds_taken(dispatcher.run_due)
        [record] = failures(subscription)["data"]
        assert record["error"] == "timeout"
        [left] = left_for_the_post
        assert left <= 0.7  # what the lookup left of the deadline, not a deadline of its own
        assert 1.0 <= elapsed < 1 + SLACK_SECONDS and 1000 <= record["duration_ms"] < (1 + SLACK_SECONDS) * 1000
    finally:
        slow.stop()


@pytest.mark.config(DELIVERY_CONCURRENCY=2, DELIVERY_TIMEOUT=0.3)  # two lookup threads, one per organization
def test_an_attempt_no_lookup_could_start_for_is_put_off_not_failed(
        client, issue_key, resolver, receiver, subscribe, ping, dispatcher, failures, listed, clock):
    lame = []
    for tenant in ("lame-1", "lame-2"):  # each holds a lookup thread with a name that never answers
        headers, name = bearer(issue_key(tenant)), f"{tenant}.partner.example"
        resolver.answers[name] = ["127.0.0.1"]
        lame.append((headers, json_of(client.post(WEBHOOKS, json={"url": receiver.url_for(name)}, headers=headers), 201)))
        resolver.stalled.add(name)
        ping_as(client, headers, lame[-1][1])
    clock.advance(0.001)  # ours falls due after theirs
    resolver.answers["ours.partner.example"] = ["127.0.0.1"]
    ours = subscribe(receiver.url_for("ours.partner.example"))
    ping(ours)
    dispatcher.run_due()
    for headers, theirs in lame:  # their own names: their own timeouts
        [record] = client.get(f"{WEBHOOKS}/{theirs['id']}/failures", headers=headers).get_json()["data"]
        assert record["error"] == "timeout"
    assert (failures(ours)["data"], listed(ours)["consecutive_failures"], receiver.received) == ([], 0, [])
    resolver.released.set()  # the lookups in its way end; it goes out at its next turn, as attempt 1

    def arrived() -> list:
        return [r for r in receiver.received if r.headers["Host"].startswith("ours.")]

    def delivered() -> bool:
        clock.advance(LookupsBusy.retry_seconds)
        dispatcher.run_due()
        return bool(arrived())
    assert eventually(delivered)
    assert ([r.headers["X-VC-Attempt"] for r in arrived()], failures(ours)["data"]) == (["1"], [])


def test_an_attempt_no_socket_could_be_had_for_is_put_off_not_failed(
        receiver, subscribe, ping, dispatcher, failures, listed, clock):
    sockets = dispatcher.courier.sender.transport.sockets
    budget, sockets.most_open = sockets.most_open, 0  # every descriptor of the budget taken
    subscription = subscribe(receiver.url)
    ping(subscription)
    dispatcher.run_due()
    assert (failures(subscription)["data"], listed(subscription)["consecutive_failures"], receiver.received) == (
        [], 0, [])

    sockets.most_open = budget
    clock.advance(SocketsBusy.retry_seconds)
    assert dispatcher.run_due() == 1
    assert ([r.headers["X-VC-Attempt"] for r in receiver.received], failures(subscription)["data"]) == (["1"], [])


def test_deleting_a_subscription_closes_its_idle_connections(
        keep_alive_ports, subscribe, ping, dispatcher, client, auth):
    receivers = keep_alive_ports()
    subscription = subscribe(f"http://127.0.0.1:{receivers.ports[0]}/hook")
    ping(subscription)
    dispatcher.run_due()
    assert receivers.open == 1

    assert client.delete(f"{WEBHOOKS}/{subscription['id']}", headers=auth).status_code == 204

    assert dispatcher.courier.sender.transport.sockets.idle == 0
    assert eventually(lambda: receivers.open == 0)


@pytest.mark.config(AUTO_DISABLE_THRESHOLD=1)
def test_an_auto_disabled_subscriptions_idle_connections_close(keep_alive_ports, subscribe, ping, dispatcher, listed):
    receivers = keep_alive_ports(status=500)
    subscription = subscribe(f"http://127.0.0.1:{receivers.ports[0]}/hook")
    ping(subscription)
    dispatcher.run_due()

    assert listed(subscription)["active"] is False
    assert dispatcher.courier.sender.transport.sockets.idle == 0
    assert eventually(lambda: receivers.open == 0)


@pytest.mark.parametrize("answer, detail", [
    ((), "lookup of gone.partner.example returned no usable IP address"),
    (socket.gaierror(socket.EAI_NONAME, "Name or service not known"),
     "lookup of gone.partner.example failed: Name or service not known"),
])
def test_a_name_that_stops_resolving_is_a_connection_error(resolver, receiver, subscribe, ping, dispatcher, failures,
                                                           answer, detail):
    resolver.answers["gone.partner.example"] = ["127.0.0.1"]
    subscription = subscribe(f"http://gone.partner.example:{receiver.server.server_port}/hook")
    resolver.answers["gone.partner.example"] = answer
    ping(subscription)
    dispatcher.run_due()
    [record] = failures(subscription)["data"]
    assert (record["error"], record["error_detail"]) == ("connection_error", detail)


@pytest.mark.both_databases
def test_an_interrupted_attempt_is_retried_after_its_lease(app, dispatcher, receiver, subscribe, ping, clock):
    event_id = ping(subscribe(receiver.url)).get_json()["id"]
    with app.app_context(), db.connection_context():
        [claim] = claim_due(int(clock() * 1000), 10, dispatcher.courier.lease_ms)  # then the process "dies"
    assert dispatcher.run_due() == 0
    clock.advance(dispatcher.courier.lease_ms / 1000 + 1)
    assert dispatcher.run_due() == 1
    assert [(r.headers["X-VC-Event-Id"], r.headers["X-VC-Attempt"]) for r in receiver.received] == \
        [(event_id, "1")]


@pytest.mark.both_databases
def test_a_late_finish_after_the_lease_was_taken_over_is_not_recorded(app, dispatcher, receiver, failing,
                                                                       ping, clock, failures):
    ping(failing)
    with app.app_context(), db.connection_context():
        [stale] = claim_due(int(clock() * 1000), 10, dispatcher.courier.lease_ms)
    clock.advance(dispatcher.courier.lease_ms / 1000 + 1)
    dispatcher.run_due()  # the takeover attempt
    dispatcher.courier.attempt(stale)  # the original claimant wakes up late
    assert [f["attempt"] for f in failures(failing)["data"]] == [1]


@pytest.mark.config(DELIVERY_POLL_INTERVAL=60, SCHEDULER_ENABLED=True)
@pytest.mark.both_databases
def test_the_scanner_delivers_a_ping_at_once_not_at_the_next_poll(dispatcher, receiver, subscribe, ping):
    subscription = subscribe(receiver.url)
    scans = counting_scans(dispatcher)
    dispatcher.start()
    assert eventually(lambda: scans)  # the first scan (at start) found nothing
    assert ping(subscription).status_code == 202
    assert receiver.wait_for(1, seconds=30)  # the next poll is 60 s away


@pytest.mark.config(DELIVERY_POLL_INTERVAL=60, SCHEDULER_ENABLED=True, DELIVERY_RETRY_DELAYS=[0.5], CLOCK=time.time)
@pytest.mark.both_databases
def test_a_retry_goes_out_when_it_is_due_not_at_the_next_poll(dispatcher, start_receiver, subscribe, ping):
    receiver = start_receiver(script=[500, 200])
    subscription = subscribe(receiver.url)
    dispatcher.start()
    assert ping(subscription).status_code == 202
    assert receiver.wait_for(2, seconds=30)  # the next poll is 60 s away
    first, retry = receiver.received
    assert 0.5 <= retry.arrived_at - first.arrived_at  # not before its delay


@pytest.mark.config(SCHEDULER_ENABLED=True, DELIVERY_TIMEOUT=60, DELIVERY_CONCURRENCY=4)
@pytest.mark.parametrize("slow_events", [1, 6])
@pytest.mark.both_databases
def test_one_slow_target_does_not_delay_the_others(dispatcher, subscribe, ping, slow_events):
    """A subscription has one attempt in flight at most, so a hanging one holds one slot of four.
    It answers nothing until the test ends: nothing that waits for it arrives meanwhile."""
    slow, fast = Receiver(script=[hang(60)]).start(), Receiver().start()
    try:
        slow_subscription = subscribe(slow.url)
        fast_subscriptions = [subscribe(fast.url) for _ in range(6)]
        for _ in range(slow_events):
            ping(slow_subscription)
        dispatcher.start()
        assert slow.wait_for(1)
        for subscription in fast_subscriptions:
            ping(subscription)
        assert fast.wait_for(6)
        assert len(slow.received) == 1  # its other events wait for its one attempt to end
    finally:
        slow.stop()
        fast.stop()


def answer_500_with(body: bytes):
    """A step answering 500 with `body` as it is (a binary or gzip error page)."""
    def step(handler):
        handler.send_response(500)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)
    return step


POISON = b"\x00error\x00\xff\xfe\x1b[31m\x80" * 600  # NUL, invalid UTF-8, an escape: 7,800 bytes


@pytest.mark.both_databases
def test_a_response_with_nul_and_invalid_utf8_is_recorded_seven_times_then_dead_lettered(
        dispatcher, receiver, subscribe, ping, clock, failures, listed):
    receiver.script = [answer_500_with(POISON)]
    subscription = subscribe(receiver.url)
    ping(subscription)
    run_for(dispatcher, clock, 3 * DAY)
    assert len(receiver.received) == 7
    records = failures(subscription, limit=100)["data"][::-1]
    assert [f["attempt"] for f in records] == [1, 2, 3, 4, 5, 6, 7]
    for record in records:
        excerpt = record["response_excerpt"]
        assert len(excerpt.encode()) <= 1024
        assert "\x00" not in excerpt and "\x1b" not in excerpt
        assert excerpt.startswith("\ufffderror\ufffd\ufffd\ufffd\ufffd[31m\ufffd")
    for earlier, later in zip(records, records[1:]):  # each attempt when its predecessor said
        assert later["attempted_at"] >= earlier["next_attempt_at"]
    assert records[-1]["next_attempt_at"] is None
    assert listed(subscription)["consecutive_failures"] == 7
    clock.advance(7 * DAY)
    assert dispatcher.run_due() == 0  # dead-lettered: never sent again


@pytest.mark.both_databases
@pytest.mark.parametrize("description", ["a\u0000b", "bell\u0007", "cr\r", "\u001b[2J"])
def test_a_description_with_control_characters_is_a_422_and_nothing_is_stored(client, auth, description):
    response = client.post(WEBHOOKS, json={"url": "https://hooks.partner.example/h",
                                           "description": description}, headers=auth)
    assert field_codes(response) == [("description", "invalid_type")]
    assert json_of(client.get(WEBHOOKS, headers=auth), 200)["data"] == []


@pytest.mark.both_databases
def test_a_url_with_nul_is_a_422(client, auth):
    response = client.post(WEBHOOKS, json={"url": "https://hooks.partner.example/a\u0000b"}, headers=auth)
    assert field_codes(response) == [("url", "invalid_url")]


@pytest.mark.both_databases
def test_tabs_and_newlines_stay_in_a_description(client, auth):
    created = json_of(client.post(WEBHOOKS, json={"url": "https://hooks.partner.example/h",
                                                   "description": "line 1\n\tline 2"}, headers=auth), 201)
    assert created["description"] == "line 1\n\tline 2"


# --- hostile receivers, end to end: what reaches the database and GET /failures --------------------

def answer(conn, head: bytes, body: bytes = b"") -> None:
    """Read the request, then send `head` and `body` exactly as given and hang up."""
    if read_request(conn) is not None:
        conn.sendall(head + body)


@functools.cache
def gzip_bomb() -> bytes:
    """10 MB that inflate to 10 GiB of "A": 640 gzip members of 16 MiB each (a valid gzip stream)."""
    return gzip.compress(b"A" * 2**24, compresslevel=9, mtime=0) * 640


def nul_and_invalid_utf8(conn, server):
    answer(conn, b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: %d\r\n\r\n" % len(POISON), POISON)


def gzip_bombed(conn, server):
    answer(conn, b"HTTP/1.1 500 Internal Server Error\r\nContent-Encoding: gzip\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(gzip_bomb()), gzip_bomb())


def ten_megabytes(conn, server):
    body = "€".encode() * (10 * 2**20 // 3)  # three bytes each: the 1,024-byte cut falls inside one
    answer(conn, b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: %d\r\n\r\n" % len(body), body)


def dripped_headers(conn, server):
    if read_request(conn) is not None:
        drip_bytes(conn, server, b"HTTP/1.1 200 OK\r\n" + b"X-Slow: y\r\n" * 100, every=0.05)


def http_09_garbage(conn, server):
    answer(conn, b"\x00\xff\xfe garbage \x1b]0;pwned\x07 and no status line\r\n\r\n" + b"\x80" * 100)


def never_reads(conn, server):
    server.stopped.wait()


POISON_TEXT = "\ufffderror\ufffd\ufffd\ufffd\ufffd[31m\ufffd"  # one POISON unit, as stored: 27 bytes
HOSTILE = [  # (behaviour, http_status, error, the excerpt stored or a check of it)
    pytest.param(nul_and_invalid_utf8, 500, "http_status", POISON_TEXT * 37 + POISON_TEXT[:-1], id="nul"),
    pytest.param(gzip_bombed, 500, "http_status",
                 lambda excerpt: excerpt == safe_text.excerpt(gzip_bomb()) and "AAAA" not in excerpt,
                 id="gzip-bomb"),
    pytest.param(ten_megabytes, 502, "http_status", "€" * 341, id="10-mb-body"),
    pytest.param(dripped_headers, None, "timeout", "", id="dripped-headers"),
    pytest.param(http_09_garbage, None, "connection_error", "", id="http-0.9-garbage"),
    pytest.param(never_reads, None, "timeout", "", id="never-reads"),
]
HOSTILE_TIMEOUT = 0.5


@pytest.mark.config(SCHEDULER_ENABLED=True, DELIVERY_CONCURRENCY=1, DELIVERY_TIMEOUT=HOSTILE_TIMEOUT,
                    WEBHOOK_ALLOWED_NETWORKS=["127.0.0.0/8"])
@pytest.mark.parametrize("behave, http_status, error, excerpt", HOSTILE)
@pytest.mark.both_databases
def test_a_hostile_receiver_costs_one_recorded_attempt_and_frees_the_only_slot(
        app, dispatcher, serve_raw, receiver, subscribe, ping, failures, behave, http_status, error, excerpt):
    hostile = subscribe(serve_raw(behave).url)
    healthy = subscribe(receiver.url)
    dispatcher.start()
    event_id = json_of(ping(hostile), 202)["id"]
    assert eventually(lambda: failures(hostile)["data"], seconds=HOSTILE_TIMEOUT + SLACK_SECONDS)  # cut at the deadline
    json_of(ping(healthy), 202)
    assert receiver.wait_for(1)  # the one delivery slot is free again: the worker is not stuck

    [record] = failures(hostile)["data"]
    assert (record["event_id"], record["attempt"], record["http_status"], record["error"]) == \
        (event_id, 1, http_status, error)
    stored = record["response_excerpt"]
    assert len(stored.encode()) <= 1024
    assert not any(ord(ch) < 0x20 and ch not in "\t\n" for ch in stored)
    assert excerpt(stored) if callable(excerpt) else stored == excerpt
    with app.app_context(), db.connection_context():
        delivery = delivery_of(event_id)
        [failure] = Failure.select().where(Failure.event == event_id)
    assert (delivery.state, delivery.attempts) == (Delivery.PENDING, 1)  # not in flight: scheduled
    assert delivery.due_at == failure.next_attempt_at and iso(delivery.due_at) == record["next_attempt_at"]
    assert 60_000 <= failure.next_attempt_at - failure.attempted_at <= 66_000  # the first delay, +10 % at most


@pytest.mark.config(SCHEDULER_ENABLED=True, DELIVERY_POLL_INTERVAL=60)
def test_a_failing_refill_scan_is_logged_not_lost(app, dispatcher, receiver, subscribe, ping, caplog):
    """The scan a finished attempt runs happens on a delivery thread: its error must reach the log."""
    database = app.config["DATABASE_URL"].removeprefix("sqlite:///")

    def refuse_further_claims(handler):
        with sqlite3.connect(database) as connection:  # claims mark rows in flight: refuse that
            connection.execute("CREATE TRIGGER no_claims BEFORE UPDATE OF state ON delivery "
                               "WHEN NEW.state = 'in_flight' BEGIN SELECT RAISE(ABORT, 'claims refused'); END")
        connection.close()
        handler.send_response(200)
        handler.send_header("Content-Length", "0")
        handler.end_headers()

    receiver.script = [refuse_further_claims]
    subscription = subscribe(receiver.url)
    assert ping(subscription).status_code == ping(subscription).status_code == 202
    dispatcher.start()
    assert eventually(lambda: _refill_errors(caplog))
    [record] = _refill_errors(caplog)
    assert "claims refused" in str(record.exc_info[1])


def _refill_errors(caplog) -> list:
    return [r for r in caplog.records if r.name == "delivery" and r.levelname == "ERROR" and r.exc_info]


def test_an_outcome_is_written_again_only_while_the_claims_lease_lasts(app, dispatcher, clock, receiver,
                                                                        subscribe, ping):
    """The lease runs from the claim, not from the end of the attempt: a slow attempt leaves less
    time to write its outcome again, and no retry may outlive the lease."""
    writes = []

    def refuse(*args):
        writes.append(time.monotonic())
        raise RuntimeError("the outcome cannot be written")

    dispatcher.courier.record, dispatcher.courier.record_pauses = refuse, (0.01, 0.01, 0.01)
    ping(subscribe(receiver.url))
    with db.connection_context():
        [claim] = claim_due(int(clock() * 1000), 1, dispatcher.courier.lease_ms)
    # As if the attempt had taken all but 10 s of the lease (a partner answering at the deadline).
    claim = dataclasses.replace(claim, claimed_at=claim.claimed_at - dispatcher.courier.lease_ms / 1000 + 10)
    with pytest.raises(RuntimeError):
        dispatcher.courier.attempt(claim)
    assert len(writes) == 1  # past the lease's safe end (half its margin before it): no retry
