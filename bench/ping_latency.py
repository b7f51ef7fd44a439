"""ping_latency: POST .../test → arrival at the receiver, one ping at a time on an idle service.

The poll interval stays at its default (2 s): only the dispatcher's wake() can make this fast.
Latency runs from just before the POST is sent to the receiver's arrival timestamp (both
CLOCK_MONOTONIC), so it includes the API request itself.
"""

import time

from harness import Partner, Receiver, Service, below, info, percentile, pick, report, workdir

PINGS = pick(200, 20)
PING_TIMEOUT = 10  # a ping that takes longer counts at this value (a poll interval is 2 s)


def main() -> dict:
    with workdir("ping") as tmp, Receiver() as receiver:
        service = Service(tmp)
        key = service.create_key()
        with service:
            partner = Partner(service, key)
            subscription = partner.subscribe(receiver.url("/ok/ping"))
            partner.ping(subscription)  # warm-up: first connection, first scan
            receiver.wait_for_count(1, PING_TIMEOUT)
            latencies, responses, lost = [], [], 0
            for _ in range(PINGS):
                time.sleep(0.01)  # idle between pings: the previous attempt has been recorded
                sent_at = time.monotonic()
                event_id = partner.ping(subscription)
                responses.append((time.monotonic() - sent_at) * 1000)
                arrived_at = receiver.wait_for_event(event_id, PING_TIMEOUT)
                if arrived_at is None:
                    lost += 1
                latencies.append(((arrived_at or sent_at + PING_TIMEOUT) - sent_at) * 1000)
            partner.close()
    figures = [
        below("p50 POST /test → arrival", percentile(latencies, 50), "ms", 20),
        below("p99 POST /test → arrival", percentile(latencies, 99), "ms", 100),
        info("max", max(latencies), "ms"),
        info("p50 of the 202 response itself", percentile(responses, 50), "ms"),
        info("pings not arrived within 10 s", lost, "pings"),
    ]
    return report("ping_latency", figures, {"pings": PINGS, "poll_interval_s": "2 (default)"},
                  {"latencies_ms": [round(v, 3) for v in latencies]})


if __name__ == "__main__":
    main()
