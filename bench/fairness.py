"""fairness: tenants share the delivery slots, and a backlog goes out oldest first.

Noisy neighbour, at the default settings (one worker, PARTNER_DELIVERY_CONCURRENCY 64): organization
A has 100 subscriptions to a healthy partner that answers after 3 s and floods them with 30 pings a
second; organization B pings its one fast subscription once a second. What B's partner sees: the
time from B's POST to the arrival, and how many of B's pings had not arrived 10 s after the last.

Slow holders: organization A has 4 subscriptions to a partner that answers 200 after 9 s, each at
its most attempts in flight (`flask webhooks set-concurrency ID 16`: 4 × 16 = every one of the 64
slots of a service run with `PARTNER_DELIVERY_CONCURRENCY=64`), and pings them 8 times a second,
enough to keep them all busy; B pings as above.

Order: 500 pings to one subscription (answering after 50 ms) pinned to one attempt in flight
(`flask webhooks set-concurrency ID 1`: strict order), all queued while no scanner runs, then a
service starts and drains them. Counted at the receiver: inversions (pairs that arrive in the
opposite order to the one they were queued in) and the drain time against 500 × 50 ms.
"""

import threading
import time

from harness import (Partner, Receiver, Service, at_most, below, info, percentile, pick, report,
                     workdir)

# Noisy neighbour and slow holders: A's subscriptions, its receiver's answer time, its pings a second,
# each subscription's pinned limit (None: adaptive) and the service's slots (None: the default).
NOISY = (100, 3000, 30, None, None)
SLOW_HOLDERS = (4, 9000, 8, 16, 64)
FLOOD_SECONDS = pick(60, 5)
B_GRACE_SECONDS = 10  # after B's last ping: what has not arrived by then counts as undelivered

ORDER_PINGS = pick(500, 50)
ORDER_RESPONSE_MS = 50


def noisy_neighbour(tmp, receiver: Receiver, name: str, a: tuple) -> tuple[list[float], int, int]:
    """B's latencies (ms, undelivered ones left out), B's undelivered count, A's pings queued, with A
    as `a` says (NOISY, SLOW_HOLDERS)."""
    subscriptions, response_ms, per_second, pin, slots = a
    with Service(tmp, {"PARTNER_DELIVERY_CONCURRENCY": str(slots)} if slots else None, name=name) as service:
        flooder = Partner(service, service.create_key(org=f"{name}-a"))
        quiet = Partner(service, service.create_key(org=f"{name}-b"))
        a_subscriptions = [flooder.subscribe(receiver.url(f"/slow/{response_ms}/{name}{i}"))
                           for i in range(subscriptions)]
        for subscription in a_subscriptions if pin else []:
            service.flask("webhooks", "set-concurrency", subscription["id"], str(pin))
        b_subscription = quiet.subscribe(receiver.url(f"/ok/{name}-b"))
        stop = threading.Event()
        queued = [0]

        def flood() -> None:
            next_at = time.monotonic()
            while not stop.is_set():
                flooder.ping(a_subscriptions[queued[0] % subscriptions])
                queued[0] += 1
                next_at += 1 / per_second
                time.sleep(max(0.0, next_at - time.monotonic()))

        flooding = threading.Thread(target=flood, daemon=True)
        flooding.start()
        sent = []
        for _ in range(FLOOD_SECONDS):
            time.sleep(1)
            sent.append((quiet.ping(b_subscription), time.monotonic()))
        stop.set()
        flooding.join()
        time.sleep(B_GRACE_SECONDS)
        latencies = []
        for event_id, sent_at in sent:
            arrived_at = receiver.wait_for_event(event_id, 0)
            if arrived_at is not None:
                latencies.append((arrived_at - sent_at) * 1000)
        flooder.close()
        quiet.close()
    return latencies, len(sent) - len(latencies), queued[0]


def order(tmp, receiver: Receiver) -> tuple[int, float]:
    """Inversions at the receiver, and the drain's duration in seconds."""
    queuing = Service(tmp, name="queuing", env={"PARTNER_SCHEDULER_ENABLED": "false"})
    with queuing:
        partner = Partner(queuing, queuing.create_key(org="ordered"))
        subscription = partner.subscribe(receiver.url(f"/slow/{ORDER_RESPONSE_MS}/order"))
        queuing.flask("webhooks", "set-concurrency", subscription["id"], "1")
        queued = [partner.ping(subscription) for _ in range(ORDER_PINGS)]
        partner.close()
    receiver.reset()
    started = time.monotonic()
    with Service(tmp, name="draining", database=queuing.database):
        receiver.wait_for_count(ORDER_PINGS, ORDER_PINGS * ORDER_RESPONSE_MS / 1000 * 4 + 30)
        drained = time.monotonic() - started
    arrivals = [receiver.arrivals[event_id][1] for event_id in queued if event_id in receiver.arrivals]
    return inversions(arrivals), drained


def inversions(values: list[float]) -> int:
    """Pairs i < j with values[i] > values[j]."""
    return sum(1 for i, earlier in enumerate(values) for later in values[i + 1:] if earlier > later)


def main() -> dict:
    with workdir("fairness") as tmp, Receiver() as receiver:
        latencies, undelivered, a_queued = noisy_neighbour(tmp, receiver, "noisy", NOISY)
        receiver.reset()
        slow, slow_undelivered, _ = noisy_neighbour(tmp, receiver, "holders", SLOW_HOLDERS)
        receiver.reset()
        inverted, drained = order(tmp, receiver)
    ideal = ORDER_PINGS * ORDER_RESPONSE_MS / 1000
    figures = [
        below("noisy neighbour: B's p99 POST → arrival", percentile(latencies or [1e9], 99), "ms", 1000),
        info("noisy neighbour: B's p50", percentile(latencies or [1e9], 50), "ms"),
        at_most(f"noisy neighbour: B's pings not arrived {B_GRACE_SECONDS} s after the last", undelivered,
                "pings", 0),
        info("noisy neighbour: A's pings queued", a_queued, "pings"),
        below("slow holders: B's p99 POST → arrival", percentile(slow or [1e9], 99), "ms", 1000),
        info("slow holders: B's max", max(slow or [1e9]), "ms"),
        at_most(f"slow holders: B's pings not arrived {B_GRACE_SECONDS} s after the last", slow_undelivered,
                "pings", 0),
        at_most(f"order: inversions among {ORDER_PINGS} pings to one subscription pinned to 1", inverted, "pairs", 0),
        at_most("order: drain time ÷ pings × response time", drained / ideal, "×", 1.2),
    ]
    return report("fairness", figures, {
        "noisy_a": NOISY, "slow_holders_a": SLOW_HOLDERS, "flood_seconds": FLOOD_SECONDS,
        "order_pings": ORDER_PINGS, "order_response_ms": ORDER_RESPONSE_MS})


if __name__ == "__main__":
    main()
