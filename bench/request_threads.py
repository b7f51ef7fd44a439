"""request_threads: does a partner ever wait for one of the worker's 8 request threads? (issue 41)

One gunicorn worker serving bench/stub_dns_app.py (names under dead.bench.test never answer once the
bench says so; every other *.bench.test is 127.0.0.1). Two organizations each keep HOLDERS creates
in flight at names that never answer (each thread sends its next when one is answered, after a pause
if it was answered at once, as bench/dns_isolation.py does), and a publisher sends a batch of BATCH
events from each of PUBLISHERS threads every second (POST /internal/v1/events/batch, fanned out to
a fourth organization's FANOUT subscriptions, which the service delivers meanwhile). A third
organization calls `GET /api/v1/partner/me` and creates a subscription to a name that answers
(deleted after it, not timed) in turn, CALL_RATE calls a second for SECONDS: their latencies. The
same calls first run alone on the same service, as a control: what the machine gives without the
holders and the publisher.
"""

import threading
import time

from dns_isolation import counted, hold_dead_creates, timed_subscribe
from harness import REPO, Partner, Receiver, Service, below, info, percentile, pick, report, workdir
from publish import Publisher, events, platform

HOLDERS = 8  # per organization: twice the per-organization bound on lookups waiting for creates
PUBLISHERS, BATCH, FANOUT = 2, 200, 2
CALL_RATE = 10  # the third organization's calls per second
SECONDS = pick(30, 5)


def publish_every_second(publisher: Publisher, stop: threading.Event, answers: list[int]) -> None:
    """A batch of BATCH to the fan-out organization at each second until stopped: each status in `answers`."""
    body = {"events": events("fanout", "bench.plain", BATCH)}
    started, n = time.monotonic(), 0
    while not stop.wait(max(0.0, started + n - time.monotonic())):
        answers.append(publisher.session.post(publisher.url + "/batch", json=body, timeout=60).status_code)
        n += 1


def third_calls(partner: Partner, receiver: Receiver) -> dict:
    """GET /me and a create to a name that answers, in turn, at CALL_RATE for SECONDS."""
    me, creates, statuses = [], [], []
    started = time.monotonic()
    for n in range(CALL_RATE * SECONDS):
        time.sleep(max(0.0, started + n / CALL_RATE - time.monotonic()))
        if n % 2:
            elapsed, response = timed_subscribe(partner, receiver.url(f"/ok/{n}", f"t-{n}.bench.test"))
            creates.append(elapsed)
            if response.status_code == 201:
                partner.delete(response.json())  # under the cap of 100 subscriptions
        else:
            called = time.monotonic()
            response = partner.session.get(f"{partner.base}/me", timeout=30)
            me.append((time.monotonic() - called) * 1000)
        statuses.append(response.status_code)
    return {"me": me, "creates": creates, "statuses": counted(statuses)}


def main() -> dict:
    with workdir("threads") as tmp, Receiver() as receiver:
        flag = tmp / "dns-dead"
        service = Service(tmp, {"PYTHONPATH": str(REPO), "BENCH_DNS_DEAD_FLAG": str(flag)},
                          app="bench.stub_dns_app:app")
        keys = {org: service.create_key(org) for org in ("holder-a", "holder-b", "third", "fanout")}
        credential = platform(service, tmp)
        with service:
            fanout, third = Partner(service, keys["fanout"]), Partner(service, keys["third"])
            for n in range(FANOUT):
                fanout.subscribe(receiver.url(f"/fanout/{n}", f"fanout-{n}.bench.test"))
            control = third_calls(third, receiver)
            flag.touch()  # the dead names answer no more
            stop, held, published = threading.Event(), [], []
            threads = [thread for org, prefix in (("holder-a", "a"), ("holder-b", "b"))
                       for thread in hold_dead_creates(service, keys[org], receiver, HOLDERS, stop, held, prefix)]
            publishers = [Publisher(service, credential) for _ in range(PUBLISHERS)]
            threads += [threading.Thread(target=publish_every_second, args=(publisher, stop, published))
                        for publisher in publishers]
            for thread in threads[-PUBLISHERS:]:
                thread.start()
            time.sleep(0.5)  # every holder's first create is under way
            try:
                measured = third_calls(third, receiver)
            finally:
                stop.set()
                for thread in threads:
                    thread.join()
            for partner in (fanout, third, *publishers):
                partner.session.close()
    me, creates = measured["me"], measured["creates"]
    figures = [
        below("third organization's GET /me p99", percentile(me, 99), "ms", 100),
        info("third organization's GET /me p50", percentile(me, 50), "ms"),
        info("third organization's GET /me max", max(me), "ms"),
        below("third organization's create (name answers) p99", percentile(creates, 99), "ms", 100),
        info("third organization's create (name answers) p50", percentile(creates, 50), "ms"),
        info("third organization's create (name answers) max", max(creates), "ms"),
        info("third organization's calls not 2xx", sum(count for status, count in measured["statuses"].items()
                                                       if not status.startswith("2")), "calls"),
        info("batches published", published.count(202), "batches"),
        info("control, alone: GET /me p99", percentile(control["me"], 99), "ms"),
        info("control, alone: create p99", percentile(control["creates"], 99), "ms"),
    ]
    parameters = {"holders_per_org": HOLDERS, "publishers": PUBLISHERS, "batch": BATCH, "fanout": FANOUT,
                  "calls_per_s": CALL_RATE, "seconds": SECONDS, "third_answers": measured["statuses"],
                  "holders_answers": counted(held), "publish_answers": counted(published)}
    return report("request_threads", figures, parameters)


if __name__ == "__main__":
    main()
