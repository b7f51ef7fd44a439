"""noisy_neighbour: one organization floods slow endpoints; how late are another's deliveries?

Org A has 100 subscriptions whose endpoints answer 200 after 3 s, and sends 30 test pings/s over
them for SECONDS; org B, meanwhile, sends one ping per second to its one fast subscription. Default
settings. B's latency runs from just before its POST .../test to the receiver's arrival timestamp; a
B event still missing WAIT_AFTER seconds after the last ping counts with the time it had waited (a
lower bound), and is reported.
"""

import threading
import time

from harness import Partner, Receiver, Service, below, info, percentile, pick, report, workdir

CROWD = 100
CROWD_RATE = 30  # pings per second, org A
QUIET_RATE = 1  # pings per second, org B
SLOW_MS = 3000
SECONDS = pick(60, 5)
WAIT_AFTER = 10


def paced(rate: float, seconds: float, send) -> list:
    """Call send(n) `rate` times a second for `seconds`; its results, each with the time sent."""
    sent, started = [], time.monotonic()
    for n in range(int(rate * seconds)):
        pause = started + n / rate - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        at = time.monotonic()
        sent.append((send(n), at))
    return sent


def main() -> dict:
    with workdir("noisy") as tmp, Receiver() as receiver:
        service = Service(tmp)
        crowd_key, quiet_key = service.create_key("crowd"), service.create_key("quiet")
        with service:
            crowd, quiet = Partner(service, crowd_key), Partner(service, quiet_key)
            slow = [crowd.subscribe(receiver.url(f"/slow/{SLOW_MS}/{n}")) for n in range(CROWD)]
            fast = quiet.subscribe(receiver.url("/ok/quiet"))
            flood = threading.Thread(target=paced, args=(CROWD_RATE, SECONDS, lambda n: crowd.ping(slow[n % CROWD])))
            flood.start()
            sent = paced(QUIET_RATE, SECONDS, lambda n: quiet.ping(fast))
            flood.join()
            give_up = time.monotonic() + WAIT_AFTER
            latencies, missing = [], 0
            for event_id, sent_at in sent:
                arrived_at = receiver.wait_for_event(event_id, max(0.0, give_up - time.monotonic()))
                if arrived_at is None:
                    missing += 1
                    arrived_at = time.monotonic()
                latencies.append((arrived_at - sent_at) * 1000)
            crowd_arrived = receiver.count - len(sent) + missing
            crowd.close()
            quiet.close()
            receiver.stop()  # drop the slow connections first, so the service stops at once
    figures = [
        below("org B p99 while org A floods slow endpoints", percentile(latencies, 99), "ms", 1000),
        info("org B p50", percentile(latencies, 50), "ms"),
        info("org B max", max(latencies), "ms"),
        info(f"org B not delivered {WAIT_AFTER} s after the last ping", missing, "events"),
        info("org A deliveries arrived during the run", crowd_arrived, "events"),
    ]
    parameters = {"crowd_subscriptions": CROWD, "crowd_rate_per_s": CROWD_RATE, "quiet_rate_per_s": QUIET_RATE,
                  "crowd_answer_ms": SLOW_MS, "seconds": SECONDS, "quiet_events": len(sent)}
    return report("noisy_neighbour", figures, parameters)


if __name__ == "__main__":
    main()
