"""isolation: 10 %, then 30 % of the subscriptions hang until the delivery deadline, the rest answer
at once. How late do the healthy subscriptions' deliveries arrive, at the default settings?

Test pings go out at a steady RATE, round-robin over the subscriptions in a shuffled order, so the
hanging ones get 10 % (30 %) of the events. Latency runs from just before POST .../test is sent to the
receiver's arrival timestamp. A control phase with the same load and no hanging subscription runs
first, on the same service. A healthy event still missing WAIT_AFTER seconds after the last ping
counts with the time it had waited (a lower bound), and is reported.
"""

import random
import time

from harness import SERVICE_ENV, Partner, Receiver, Service, below, info, percentile, pick, report, workdir

SUBSCRIPTIONS = 100
RATE = 20  # test pings per second, over all subscriptions
SECONDS = pick(30, 3)
TIMEOUT = pick(10, 2)  # PARTNER_DELIVERY_TIMEOUT: 10 s is the default and the SPEC's deadline
WAIT_AFTER = pick(30, 4)


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


def measure(hanging: int, with_control: bool) -> tuple[dict | None, dict]:
    """The mixed run (and, first, the control) on one service at the default settings."""
    rng = random.Random(5)
    with workdir("isolation") as tmp, Receiver() as receiver:
        service = Service(tmp, {"PARTNER_DELIVERY_TIMEOUT": str(TIMEOUT)})
        key = service.create_key()
        with service:
            partner = Partner(service, key)
            healthy = [(partner.subscribe(receiver.url(f"/ok/{n}")), True)
                       for n in range(SUBSCRIPTIONS - hanging)]
            stuck = [(partner.subscribe(receiver.url(f"/hang/{n}")), False) for n in range(hanging)]
            control = None
            if with_control:
                control_targets = healthy + healthy[:hanging]  # same load, nobody hangs
                rng.shuffle(control_targets)
                control = drive(partner, receiver, control_targets)
            targets = healthy + stuck
            rng.shuffle(targets)
            mixed = drive(partner, receiver, targets)
            partner.close()
            receiver.stop()  # drop the hung connections first, so the service stops at once
    return control, mixed


def main() -> dict:
    # A hanging subscription holds one slot (one attempt in flight per subscription) until the
    # deadline; the default pool leaves the healthy ones enough, and subscriptions whose last
    # attempt failed may hold at most half of it.
    control, tenth = measure(SUBSCRIPTIONS // 10, with_control=True)
    _, third = measure(SUBSCRIPTIONS * 3 // 10, with_control=False)
    figures = []
    for share, mixed in (("10 %", tenth), ("30 %", third)):
        latencies = mixed["latencies"]
        figures += [
            below(f"healthy p99, {share} hanging", percentile(latencies, 99), "ms", 1000),
            info(f"healthy p50, {share} hanging", percentile(latencies, 50), "ms"),
            info(f"healthy max, {share} hanging", max(latencies), "ms"),
            info(f"healthy not delivered {WAIT_AFTER} s after the last ping, {share} hanging",
                 mixed["missing"], "events"),
        ]
    figures += [
        info("control: healthy p99, nobody hangs", percentile(control["latencies"], 99), "ms"),
        info("control: healthy p50, nobody hangs", percentile(control["latencies"], 50), "ms"),
    ]
    parameters = {"subscriptions": SUBSCRIPTIONS, "hanging": "10 and 30", "rate_per_s": RATE,
                  "seconds": SECONDS, "delivery_timeout_s": TIMEOUT,
                  "concurrency": SERVICE_ENV.get("PARTNER_DELIVERY_CONCURRENCY", "default"),
                  "healthy_events": len(tenth["latencies"]) + len(third["latencies"]),
                  "hanging_events": tenth["hanging_pings"] + third["hanging_pings"]}
    return report("isolation", figures, parameters)


if __name__ == "__main__":
    main()
