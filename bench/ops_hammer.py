"""ops_hammer: do the operator's endpoints cost anything to ask? 16 clients hammer /readyz (then
/metrics) as fast as they can while a partner triggers test pings; the partner's POST .../test p99
is set against the same with 16 clients hammering /healthz, which touches nothing. Commits made
while /readyz (or /metrics) alone is hammered, before the pings start, are counted from a
connection of the bench's own (SQLite's data_version moves with every commit by another
connection): there must be none.
"""

import sqlite3
import threading
import time

from harness import (Partner, Receiver, Service, at_most, http_session, info, percentile, pick, report,
                     workdir)

CLIENTS = 16
SECONDS = pick(10, 3)
PING_EVERY = 0.02
QUIET_SECONDS = 2


def hammer(service: Service, path: str, partner: Partner, subscription: dict,
           database: str) -> tuple[list[float], int, int]:
    """The partner's POST latencies (ms), the hammer's request count, and the commits the hammer
    alone made."""
    stop = threading.Event()
    asked = [0] * CLIENTS

    def client(n: int) -> None:
        with http_session() as session:
            while not stop.is_set():
                session.get(service.base_url + path, timeout=10)
                asked[n] += 1

    watcher = sqlite3.connect(database, isolation_level=None)
    threads = [threading.Thread(target=client, args=(n,), daemon=True) for n in range(CLIENTS)]
    for thread in threads:
        thread.start()
    # First the hammer alone: whatever commits now, the hammer made (the scanner finds nothing due).
    before = watcher.execute("PRAGMA data_version").fetchone()[0]
    time.sleep(QUIET_SECONDS)
    commits = watcher.execute("PRAGMA data_version").fetchone()[0] - before
    watcher.close()
    latencies = []
    ends_at = time.monotonic() + SECONDS
    while time.monotonic() < ends_at:
        started = time.monotonic()
        partner.ping(subscription)
        latencies.append((time.monotonic() - started) * 1000)
        time.sleep(PING_EVERY)
    stop.set()
    for thread in threads:
        thread.join()
    return latencies, sum(asked), commits


def main() -> dict:
    results = {}
    with workdir("ops-hammer") as tmp, Receiver() as receiver:
        with Service(tmp) as service:
            partner = Partner(service, service.create_key())
            subscription = partner.subscribe(receiver.url("/ok/hammer"))
            for path in ("/healthz", "/readyz", "/metrics"):
                results[path] = hammer(service, path, partner, subscription, str(service.database))
            partner.close()
    p99 = {path: percentile(latencies, 99) for path, (latencies, _, _) in results.items()}
    figures = [info(f"POST /test p99 while {CLIENTS} clients hammer {path}", value, "ms")
               for path, value in p99.items()]
    figures += [info(f"{path} requests answered in {SECONDS} s", asked, "requests")
                for path, (_, asked, _) in results.items()]
    figures += [
        at_most("POST /test p99: /readyz hammer ÷ /healthz hammer", p99["/readyz"] / p99["/healthz"], "×", 1.2),
        at_most("POST /test p99: /metrics hammer ÷ /healthz hammer", p99["/metrics"] / p99["/healthz"], "×", 1.2),
        at_most(f"commits while /readyz alone is hammered for {QUIET_SECONDS} s", results["/readyz"][2], "commits", 0),
        at_most(f"commits while /metrics alone is hammered for {QUIET_SECONDS} s", results["/metrics"][2], "commits", 0),
    ]
    return report("ops_hammer", figures, {"clients": CLIENTS, "seconds": SECONDS})


if __name__ == "__main__":
    main()
