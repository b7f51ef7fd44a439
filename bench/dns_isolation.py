"""dns_isolation: five subscriptions whose host names' DNS never answers, beside 95 healthy ones, at
the default settings. How late do the healthy subscriptions' deliveries arrive?

The service runs with a stub resolver (bench/stub_dns_app.py): every name resolves while the
subscriptions are created, then the five dead names stop answering. Pings go out as in
bench/isolation.py, at a steady rate, round-robin over the subscriptions in a shuffled order.
Each attempt to a dead name waits for its lookup until the delivery deadline and is a timeout.
"""

import random

from harness import REPO, Partner, Receiver, Service, below, info, percentile, report, workdir
from isolation import RATE, SECONDS, TIMEOUT, WAIT_AFTER, drive

SUBSCRIPTIONS = 100
DEAD = 5


def main() -> dict:
    rng = random.Random(7)
    with workdir("dns") as tmp, Receiver() as receiver:
        flag = tmp / "dns-dead"
        service = Service(tmp, {"PYTHONPATH": str(REPO), "BENCH_DNS_DEAD_FLAG": str(flag),
                                "PARTNER_DELIVERY_TIMEOUT": str(TIMEOUT)}, app="bench.stub_dns_app:app")
        key = service.create_key()
        with service:
            partner = Partner(service, key)
            healthy = [(partner.subscribe(receiver.url(f"/ok/{n}", f"ok-{n}.bench.test")), True)
                       for n in range(SUBSCRIPTIONS - DEAD)]
            dead = [(partner.subscribe(receiver.url(f"/dead/{n}", f"host-{n}.dead.bench.test")), False)
                    for n in range(DEAD)]
            flag.touch()
            targets = healthy + dead
            rng.shuffle(targets)
            mixed = drive(partner, receiver, targets)
            errors = [record["error"] for subscription, _ in dead for record in partner.failures(subscription)]
            partner.close()
    latencies = mixed["latencies"]
    figures = [
        below(f"healthy p99 beside {DEAD} dead names", percentile(latencies, 99), "ms", 1000),
        info(f"healthy p50 beside {DEAD} dead names", percentile(latencies, 50), "ms"),
        info(f"healthy max beside {DEAD} dead names", max(latencies), "ms"),
        info(f"healthy not delivered {WAIT_AFTER} s after the last ping", mixed["missing"], "events"),
        info("attempts to dead names recorded", len(errors), "attempts"),
        info("of which timeouts", errors.count("timeout"), "attempts"),
    ]
    parameters = {"subscriptions": SUBSCRIPTIONS, "dead_names": DEAD, "rate_per_s": RATE,
                  "seconds": SECONDS, "delivery_timeout_s": TIMEOUT, "healthy_events": len(latencies),
                  "dead_name_events": mixed["hanging_pings"]}
    return report("dns_isolation", figures, parameters)


if __name__ == "__main__":
    main()
