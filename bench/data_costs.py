"""data_costs: what two promises about data cost. Acknowledged means durable: the commits behind a
2xx are fsynced (synchronous=FULL) where release 1.1 made every commit NORMAL. Secrets sealed at
rest: every claim opens its subscription's webhook secret (AES-GCM).

Each is measured against the same service with that cost taken out (bench/variant_app.py), side by
side in one run. API writes: 2,000 test pings (each a commit acknowledged with a 202) from 4 client
threads; the latency of each request. Drains: one backlog of 3,000 pings over 30 subscriptions (as
bench/scale_out), drained by each variant from a copy, ROUNDS times in turn; each figure is the
median of its rounds. A drain moves from run to run far more than opening a secret costs
(docs/performance.md), so the cost itself is also timed directly, in this process: one open, against
a delivery's worker CPU.
"""

import sys
import time
import timeit

from harness import (REPO, Partner, Receiver, Service, at_least, info, median_drains, percentile, pick,
                     queue_backlog, report, run_threads, slug, workdir)
from scale_out import EVENTS, SUBSCRIPTIONS

sys.path.insert(0, str(REPO))
from partner import sealing  # noqa: E402

WRITES = pick(2000, 200)
CLIENTS = 4
ROUNDS = pick(5, 1)
SERVICE = ("wsgi:app", {})
# PYTHONPATH: bench/ lives in this repo, whatever tree BENCH_SERVICE_ROOT points at.
VARIANTS = {name: ("bench.variant_app:app", {"BENCH_VARIANT": variant, "PYTHONPATH": str(REPO)})
            for name, variant in (("NORMAL commits", "normal_commits"), ("unsealed secrets", "unsealed_secrets"))}
DRAINED = {"service": SERVICE, **VARIANTS}


def api_write_latencies(tmp, receiver: Receiver, name: str, app: str, env: dict) -> list[float]:
    """Milliseconds of each POST .../test, with the scanner off (nothing but the API writes)."""
    service = Service(tmp, {"PARTNER_SCHEDULER_ENABLED": "false", **env}, app=app, name=slug(name),
                      database=tmp / f"writes-{slug(name)}.sqlite3")
    key = service.create_key()
    latencies: list[float] = []
    with service:
        partners = [Partner(service, key) for _ in range(CLIENTS)]
        subscription = partners[0].subscribe(receiver.url("/ok/writes"))

        def client(n: int) -> None:
            partner = partners[n]
            for _ in range(WRITES // CLIENTS):
                started = time.perf_counter()
                partner.ping(subscription)
                latencies.append((time.perf_counter() - started) * 1000)
            partner.close()
        run_threads(client, CLIENTS)
    return latencies


def open_microseconds(count: int = 100_000) -> float:
    """One open of a sealed webhook secret (what every claim adds), timed in this process."""
    sealing.use(sealing.keyring_of([sealing.new_key()]))
    key_id, sealed = sealing.seal("wh_bench", "whsec_" + "a" * 43)
    return timeit.timeit(lambda: sealing.open_secret("wh_bench", key_id, sealed), number=count) / count * 1e6


def main() -> dict:
    with workdir("data-costs") as tmp, Receiver() as receiver:
        writes = {name: api_write_latencies(tmp, receiver, name, *variant)
                  for name, variant in {"service": SERVICE, "NORMAL commits": VARIANTS["NORMAL commits"]}.items()}
        backlog, _ = queue_backlog(tmp, receiver, SUBSCRIPTIONS, EVENTS)
        drains = median_drains(tmp, receiver, EVENTS, backlog, DRAINED, ROUNDS)
    figures = []
    for name, latencies in writes.items():
        figures += [info(f"API write p50, {name}", percentile(latencies, 50), "ms"),
                    info(f"API write p99, {name}", percentile(latencies, 99), "ms")]
    figures += [info(f"drain, {name}", rate, "deliveries/s") for name, (rate, _) in drains.items()]
    figures += [info(f"worker CPU per delivery, {name}", cpu, "ms") for name, (_, cpu) in drains.items()]
    rate = {name: rate for name, (rate, _) in drains.items()}
    figures += [info("drain, FULL acknowledged ÷ NORMAL everywhere", rate["service"] / rate["NORMAL commits"], "×"),
                at_least("drain, encryption on ÷ off", rate["service"] / rate["unsealed secrets"], "×", 0.95)]
    opened = open_microseconds()
    figures += [info("opening a sealed secret, in process", opened, "µs"),
                info("of it: share of a delivery's worker CPU", opened / 10 / drains["service"][1], "%")]
    return report("data_costs", figures, {"writes": WRITES, "clients": CLIENTS, "events": EVENTS,
                                          "subscriptions": SUBSCRIPTIONS, "drain rounds": ROUNDS})


if __name__ == "__main__":
    main()
