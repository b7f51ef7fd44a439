"""dns_isolation: five subscriptions whose host names' DNS never answers, beside 95 healthy ones, at
the default settings. How late do the healthy subscriptions' deliveries arrive?

The service runs with a stub resolver (bench/stub_dns_app.py): every name resolves while the
subscriptions are created, then the five dead names stop answering. Pings go out as in
bench/isolation.py, at a steady rate, round-robin over the subscriptions in a shuffled order.
Each attempt to a dead name waits for its lookup until the delivery deadline and is a timeout.

Then one organization keeps CREATES_IN_FLIGHT creates in flight at dead names of its own (each
thread sends the next when one is answered, after REFUSED_PAUSE if it was answered at once: a tight
loop of refusals would measure the CPU, not the lookups) while another (a new one: the first holds
its 100 subscriptions) creates OTHER_CREATES subscriptions, one at a time, and pings each: how long
do its creates take, are any refused, and do its pings arrive?
"""

import random
import threading
import time

import requests
from harness import REPO, Partner, Receiver, Service, below, info, percentile, pick, report, workdir
from isolation import RATE, SECONDS, TIMEOUT, WAIT_AFTER, drive

SUBSCRIPTIONS = 100
DEAD = 5
CREATES_IN_FLIGHT = 12
OTHER_CREATES = pick(40, 20)
REFUSED_PAUSE = 0.1  # seconds


def timed_subscribe(partner: Partner, url: str) -> tuple[float, requests.Response]:
    """POST /webhooks; how many milliseconds it took, and the response, whatever its status."""
    started = time.monotonic()
    response = partner.session.post(f"{partner.base}/webhooks", json={"url": url}, timeout=30)
    return (time.monotonic() - started) * 1000, response


def hold_dead_creates(service: Service, key: str, receiver: Receiver, threads: int, stop: threading.Event,
                      answers: list[int], prefix: str = "a") -> list[threading.Thread]:
    """`threads` threads of the key's organization, each keeping one create in flight at a name of its
    own that never answers, until `stop`: every answer's status in `answers`; the threads, started."""
    def keep_creating(n: int) -> None:
        creator = Partner(service, key)
        try:
            while not stop.is_set():
                url = receiver.url(f"/{prefix}/{n}", f"{prefix}{n}.dead.bench.test")
                elapsed, response = timed_subscribe(creator, url)
                answers.append(response.status_code)
                if elapsed < 1000 * REFUSED_PAUSE:
                    stop.wait(REFUSED_PAUSE)
        finally:
            creator.close()

    started = [threading.Thread(target=keep_creating, args=(n,)) for n in range(threads)]
    for thread in started:
        thread.start()
    return started


def beside_dead_creates(service: Service, receiver: Receiver) -> dict:
    """OTHER_CREATES creates and pings by one organization while another keeps CREATES_IN_FLIGHT
    creates in flight at names that never answer."""
    stop, attacker_answers = threading.Event(), []
    partner = Partner(service, service.create_key("other"))
    threads = hold_dead_creates(service, service.create_key("attacker"), receiver, CREATES_IN_FLIGHT, stop,
                                attacker_answers)
    time.sleep(0.5)  # every attacker create is under way
    creates, statuses, events = [], [], []
    try:
        for n in range(OTHER_CREATES):
            elapsed, response = timed_subscribe(partner, receiver.url(f"/t/{n}", f"t-{n}.bench.test"))
            creates.append(elapsed)
            statuses.append(response.status_code)
            if response.status_code == 201:
                events.append(partner.ping(response.json()))
        missing = sum(receiver.wait_for_event(event_id, WAIT_AFTER) is None for event_id in events)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        partner.close()
    return {"creates": creates, "refused": len(statuses) - statuses.count(201), "missing": missing,
            "statuses": counted(statuses), "attacker_statuses": counted(attacker_answers)}


def counted(statuses: list[int]) -> dict[str, int]:
    return {str(status): statuses.count(status) for status in sorted(set(statuses))}


def main() -> dict:
    rng = random.Random(7)
    with workdir("dns") as tmp, Receiver() as receiver:
        flag = tmp / "dns-dead"
        service = Service(tmp, {"PYTHONPATH": str(REPO), "BENCH_DNS_DEAD_FLAG": str(flag),
                                "PARTNER_DELIVERY_TIMEOUT": str(TIMEOUT)}, app="bench.stub_dns_app:app")
        key = service.create_key()
        with service:
            partner = Partner(service, key)
            healthy, idle_creates = [], []
            for n in range(SUBSCRIPTIONS - DEAD):
                elapsed, response = timed_subscribe(partner, receiver.url(f"/ok/{n}", f"ok-{n}.bench.test"))
                if response.status_code != 201:
                    partner.fail("POST /webhooks", response)
                healthy.append((response.json(), True))
                idle_creates.append(elapsed)
            dead = [(partner.subscribe(receiver.url(f"/dead/{n}", f"host-{n}.dead.bench.test")), False)
                    for n in range(DEAD)]
            flag.touch()
            targets = healthy + dead
            rng.shuffle(targets)
            mixed = drive(partner, receiver, targets)
            errors = [record["error"] for subscription, _ in dead for record in partner.failures(subscription)]
            beside = beside_dead_creates(service, receiver)
            partner.close()
    latencies, creates = mixed["latencies"], beside["creates"]
    figures = [
        info("create p50, nothing dead", percentile(idle_creates, 50), "ms"),
        below(f"healthy p99 beside {DEAD} dead names", percentile(latencies, 99), "ms", 1000),
        info(f"healthy p50 beside {DEAD} dead names", percentile(latencies, 50), "ms"),
        info(f"healthy max beside {DEAD} dead names", max(latencies), "ms"),
        info(f"healthy not delivered {WAIT_AFTER} s after the last ping", mixed["missing"], "events"),
        info("attempts to dead names recorded", len(errors), "attempts"),
        info("of which timeouts", errors.count("timeout"), "attempts"),
        below(f"create p99 beside {CREATES_IN_FLIGHT} dead creates of another organization",
              percentile(creates, 99), "ms", 1000),
        info(f"create p50 beside {CREATES_IN_FLIGHT} dead creates of another organization",
             percentile(creates, 50), "ms"),
        info("of those creates refused", beside["refused"], "creates"),
        info(f"of their pings not delivered {WAIT_AFTER} s later", beside["missing"], "pings"),
    ]
    parameters = {"subscriptions": SUBSCRIPTIONS, "dead_names": DEAD, "rate_per_s": RATE,
                  "seconds": SECONDS, "delivery_timeout_s": TIMEOUT, "healthy_events": len(latencies),
                  "dead_name_events": mixed["hanging_pings"],
                  "other_creates": OTHER_CREATES, "other_answers": beside["statuses"],
                  "attacker_answers": beside["attacker_statuses"]}
    return report("dns_isolation", figures, parameters)


if __name__ == "__main__":
    main()
