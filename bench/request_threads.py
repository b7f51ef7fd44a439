"""request_threads: does a partner ever wait for one of the worker's 8 request threads? (issue 41)

One gunicorn worker serving bench/stub_dns_app.py (names under dead.bench.test never answer once the
bench says so; every other *.bench.test is 127.0.0.1). Two organizations each keep HOLDERS creates
in flight at names that never answer (each thread sends its next when one is answered, after a pause
if it was answered at once, as bench/dns_isolation.py does), and a publisher sends a batch of BATCH
events from each of PUBLISHERS threads every second (POST /internal/v1/events/batch, fanned out to
a fourth organization's FANOUT subscriptions, which the service delivers meanwhile). A third
organization calls `GET /api/v1/partner/me` and creates a subscription to a name that answers
(deleted after it, not timed) in turn, CALL_RATE calls a second for SECONDS: their latencies. The
same calls run first alone, then beside the holders only and beside the publisher only, on the same
service: what the machine gives, and which of the two a tail comes with.
"""

import re
import threading
import time
from contextlib import contextmanager

from dns_isolation import counted, hold_dead_creates, timed_subscribe
from harness import REPO, Partner, Receiver, Service, below, info, percentile, pick, report, workdir
from publish import Publisher, events, platform

HOLDERS = 8  # per organization: twice the per-organization bound on lookups waiting for creates
PUBLISHERS, BATCH, FANOUT = 2, 200, 2
CALL_RATE = 10  # the third organization's calls per second
SECONDS = pick(20, 4)  # per phase
ACCESS_TAIL = re.compile(r" (\d+)ms (\S+)$")  # the end of an access line: its milliseconds and X-Request-Id


def publish_every_second(publisher: Publisher, stop: threading.Event, answers: list[int]) -> None:
    """A batch of BATCH to the fan-out organization at each second until stopped: each status in `answers`."""
    body = {"events": events("fanout", "bench.plain", BATCH)}
    started, n = time.monotonic(), 0
    while not stop.wait(max(0.0, started + n - time.monotonic())):
        answers.append(publisher.session.post(publisher.url + "/batch", json=body, timeout=60).status_code)
        n += 1


def third_calls(partner: Partner, receiver: Receiver) -> dict:
    """GET /me and a create to a name that answers, in turn, at CALL_RATE for SECONDS: each call's
    milliseconds and its X-Request-Id."""
    me, creates, statuses = [], [], []
    started = time.monotonic()
    for n in range(CALL_RATE * SECONDS):
        time.sleep(max(0.0, started + n / CALL_RATE - time.monotonic()))
        if n % 2:
            elapsed, response = timed_subscribe(partner, receiver.url(f"/ok/{n}", f"t-{n}.bench.test"))
            creates.append((elapsed, response.headers.get("X-Request-Id")))
            if response.status_code == 201:
                partner.delete(response.json())  # under the cap of 100 subscriptions
        else:
            called = time.monotonic()
            response = partner.session.get(f"{partner.base}/me", timeout=30)
            me.append(((time.monotonic() - called) * 1000, response.headers.get("X-Request-Id")))
        statuses.append(response.status_code)
    return {"me": me, "creates": creates, "statuses": counted(statuses)}


def handled_ms(service: Service) -> dict[str, float]:
    """Each request's milliseconds in a request thread, from the access log (gunicorn's %(M)s, counted
    from when a thread took the request up), by its X-Request-Id."""
    lines = (service.workdir / f"{service.name}.out").read_text(errors="replace").splitlines()
    return {match[2]: float(match[1]) for line in lines if (match := ACCESS_TAIL.search(line))}


def waits_outside(calls: list[tuple[float, str]], handled: dict[str, float]) -> list[float]:
    """What each call waited beyond its time in a thread: for a thread, and on the way in and out."""
    return [elapsed - handled[request_id] for elapsed, request_id in calls if request_id in handled]


class Load:
    """What runs beside the third organization's calls in a phase: the holders' dead creates, the
    publisher's batches, or both; every answer's status."""

    def __init__(self, service: Service, keys: dict, credential: str, receiver: Receiver):
        self.service, self.keys, self.credential, self.receiver = service, keys, credential, receiver
        self.held, self.published = [], []

    @contextmanager
    def running(self, holders: bool, publishing: bool):
        stop, threads, publishers = threading.Event(), [], []
        if holders:
            threads += [thread for org, prefix in (("holder-a", "a"), ("holder-b", "b"))
                        for thread in hold_dead_creates(self.service, self.keys[org], self.receiver, HOLDERS, stop,
                                                        self.held, prefix)]
        if publishing:
            publishers = [Publisher(self.service, self.credential) for _ in range(PUBLISHERS)]
            for publisher in publishers:
                threads.append(threading.Thread(target=publish_every_second, args=(publisher, stop, self.published)))
                threads[-1].start()
        time.sleep(0.5 if threads else 0)  # every holder's first create is under way
        try:
            yield
        finally:
            stop.set()
            for thread in threads:
                thread.join()
            for publisher in publishers:
                publisher.session.close()


PHASES = {"alone": (False, False), "beside the holders": (True, False), "beside the publisher": (False, True),
          "beside both": (True, True)}


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
            flag.touch()  # the dead names answer no more
            load, measured = Load(service, keys, credential, receiver), {}
            for phase, (holders, publishing) in PHASES.items():
                with load.running(holders, publishing):
                    measured[phase] = third_calls(third, receiver)
            fanout.close()
            third.close()
        handled = handled_ms(service)
    for result in measured.values():
        result["outside"] = waits_outside(result["me"] + result["creates"], handled)
        result["me"], result["creates"] = [[ms for ms, _ in result[kind]] for kind in ("me", "creates")]
    both = measured["beside both"]
    figures = [
        below("third organization's GET /me p99 beside both", percentile(both["me"], 99), "ms", 100),
        info("third organization's GET /me p50 beside both", percentile(both["me"], 50), "ms"),
        info("third organization's GET /me max beside both", max(both["me"]), "ms"),
        below("third organization's create (name answers) p99 beside both", percentile(both["creates"], 99), "ms",
              100),
        info("third organization's create (name answers) p50 beside both", percentile(both["creates"], 50), "ms"),
        info("third organization's create (name answers) max beside both", max(both["creates"]), "ms"),
    ]
    for phase in list(PHASES)[:-1]:
        figures += [info(f"GET /me p99 {phase}", percentile(measured[phase]["me"], 99), "ms"),
                    info(f"create p99 {phase}", percentile(measured[phase]["creates"], 99), "ms")]
    for phase, result in measured.items():
        figures += [info(f"waited outside a request thread, p99, {phase}", percentile(result["outside"], 99), "ms"),
                    info(f"waited outside a request thread, max, {phase}", max(result["outside"]), "ms")]
    figures.append(info("of the calls found in the access log", sum(len(r["outside"]) for r in measured.values()),
                        "calls"))
    figures += [
        info("third organization's calls not 2xx", sum(count for result in measured.values()
                                                       for status, count in result["statuses"].items()
                                                       if not status.startswith("2")), "calls"),
        info("batches published", load.published.count(202), "batches"),
    ]
    parameters = {"holders_per_org": HOLDERS, "publishers": PUBLISHERS, "batch": BATCH, "fanout": FANOUT,
                  "calls_per_s": CALL_RATE, "seconds_per_phase": SECONDS, "third_answers": both["statuses"],
                  "holders_answers": counted(load.held), "publish_answers": counted(load.published)}
    return report("request_threads", figures, parameters)


if __name__ == "__main__":
    main()
