"""isolation: 10 % of the subscriptions hang until the delivery deadline, the rest answer at once.
How late do the healthy subscriptions' deliveries arrive?

Test pings go out at a steady RATE, round-robin over the subscriptions in a shuffled order, so the
hanging ones get 10 % of the events. Latency runs from just before POST .../test is sent to the
receiver's arrival timestamp. A control phase with the same load and no hanging subscription runs
first, on the same service. A healthy event still missing WAIT_AFTER seconds after the last ping
counts with the time it had waited (a lower bound), and is reported.
"""

import random
import time

from harness import (SERVICE_ENV, Partner, Receiver, Service, below, info, percentile, pick, report,
                     workdir)

SUBSCRIPTIONS = 100
HANGING = 10
RATE = 20  # test pings per second, over all subscriptions
SECONDS = pick(30, 3)
TIMEOUT = pick(10, 2)  # PARTNER_DELIVERY_TIMEOUT: 10 s is the default and the SPEC's deadline
WAIT_AFTER = pick(30, 4)
WIDER_CONCURRENCY = 16  # more slots than hanging subscriptions


def drive(partner: Partner, receiver: Receiver, targets: list[tuple[dict, bool]]) -> dict:
    """Ping at RATE for SECONDS; the healthy events' latencies (ms) and how many never arrived."""
    sent = []  # (event id, sent at, healthy)
    started = time.monotonic()
    for n in range(RATE * SECONDS):
        pause = started + n / RATE - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        subscription, healthy = targets[n % len(targets)]
        sent_at = time.monotonic()
        sent.append((partner.ping(subscription), sent_at, healthy))
    give_up = time.monotonic() + WAIT_AFTER
    latencies, missing = [], 0
    for event_id, sent_at, healthy in sent:
        if not healthy:
            continue
        arrived_at = receiver.wait_for_event(event_id, max(0.0, give_up - time.monotonic()))
        if arrived_at is None:
            missing += 1
            arrived_at = time.monotonic()
        latencies.append((arrived_at - sent_at) * 1000)
    return {"latencies": latencies, "missing": missing, "hanging_pings": sum(not h for *_, h in sent),
            "pace_s": time.monotonic() - started}


def measure(concurrency: int | None) -> tuple[dict, dict]:
    """The control and the mixed run on one service; `concurrency` None keeps the default."""
    rng = random.Random(5)
    settings = {"PARTNER_DELIVERY_TIMEOUT": str(TIMEOUT)}
    if concurrency:
        settings["PARTNER_DELIVERY_CONCURRENCY"] = str(concurrency)
    with workdir("isolation") as tmp, Receiver() as receiver:
        service = Service(tmp, settings)
        key = service.create_key()
        with service:
            partner = Partner(service, key)
            healthy = [(partner.subscribe(receiver.url(f"/ok/{n}")), True)
                       for n in range(SUBSCRIPTIONS - HANGING)]
            hanging = [(partner.subscribe(receiver.url(f"/hang/{n}")), False) for n in range(HANGING)]
            control_targets = healthy + healthy[:HANGING]  # same load, nobody hangs
            rng.shuffle(control_targets)
            control = drive(partner, receiver, control_targets)
            targets = healthy + hanging
            rng.shuffle(targets)
            mixed = drive(partner, receiver, targets)
            partner.close()
            receiver.stop()  # drop the hung connections first, so the service stops at once
    return control, mixed


def main() -> dict:
    # Each hanging subscription holds one slot (one attempt in flight per subscription) until the
    # deadline, so healthy deliveries keep (concurrency - hanging) slots: none at the default 8
    # with 10 hanging, plenty at 16. Both are measured.
    control, mixed = measure(None)
    _, wider = measure(WIDER_CONCURRENCY)
    latencies = mixed["latencies"]
    figures = [
        below("healthy p99, 10 % hanging", percentile(latencies, 99), "ms", 1000),
        info("healthy p50, 10 % hanging", percentile(latencies, 50), "ms"),
        info("healthy max, 10 % hanging", max(latencies), "ms"),
        info(f"healthy not delivered {WAIT_AFTER} s after the last ping", mixed["missing"], "events"),
        below(f"healthy p99, 10 % hanging, concurrency {WIDER_CONCURRENCY}",
              percentile(wider["latencies"], 99), "ms", 1000),
        info(f"healthy p50, 10 % hanging, concurrency {WIDER_CONCURRENCY}",
             percentile(wider["latencies"], 50), "ms"),
        info("control: healthy p99, nobody hangs", percentile(control["latencies"], 99), "ms"),
        info("control: healthy p50, nobody hangs", percentile(control["latencies"], 50), "ms"),
    ]
    parameters = {"subscriptions": SUBSCRIPTIONS, "hanging": HANGING, "rate_per_s": RATE,
                  "seconds": SECONDS, "delivery_timeout_s": TIMEOUT,
                  "concurrency": SERVICE_ENV.get("PARTNER_DELIVERY_CONCURRENCY", "8 (default)"),
                  "wider_concurrency": WIDER_CONCURRENCY,
                  "healthy_events": len(latencies), "hanging_events": mixed["hanging_pings"]}
    return report("isolation", figures, parameters)


if __name__ == "__main__":
    main()
