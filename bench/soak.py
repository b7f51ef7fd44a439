"""soak: mixed load on one gunicorn for a long while, watching the worker for leaks.

Partners ping subscriptions whose receivers are 70 % healthy, 20 % failing (500 with a binary body)
and 10 % hanging (the delivery deadline ends each attempt), while others read GET /me and
GET /webhooks. The worker's RSS, open files and threads are sampled every few seconds; the figures
are their growth per hour after a warm-up (a least-squares slope), so a leak shows as a slope,
not as a level. 30 minutes by default (BENCH_SOAK_MINUTES), 15 s in quick mode (a smoke run only:
its slopes mean nothing).
"""

import os
import threading
import time

from harness import (QUICK, Partner, Receiver, Service, below, info, memory_kib, pick, report,
                     workdir)

MINUTES = float(os.environ.get("BENCH_SOAK_MINUTES", pick(30, 0.25)))
WARMUP_FRACTION = 0.2  # samples before this share of the run are warm-up, left out of the slopes
SAMPLE_SECONDS = pick(10, 1)
SUBSCRIPTIONS = 20  # 14 healthy, 4 failing, 2 hanging
PINGS_PER_SECOND = pick(20, 10)
READERS = 2
ENV = {"PARTNER_DELIVERY_TIMEOUT": "2", "PARTNER_DELIVERY_RETRY_DELAYS": "[1, 2, 4]",
       "PARTNER_AUTO_DISABLE_THRESHOLD": "1000000"}  # failing partners keep failing, never disabled


def paths() -> list[str]:
    kinds = ["ok"] * 14 + ["fail"] * 4 + ["hang"] * 2
    return [f"/{kind}/{n}" for n, kind in enumerate(kinds)]


def open_files(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def slope_per_hour(samples: list[tuple[float, float]]) -> float:
    """Least-squares growth of (seconds, value) samples, per hour."""
    if len(samples) < 2:
        return 0.0
    n = len(samples)
    mean_t = sum(t for t, _ in samples) / n
    mean_v = sum(v for _, v in samples) / n
    spread = sum((t - mean_t) ** 2 for t, _ in samples)
    if spread == 0:
        return 0.0
    return sum((t - mean_t) * (v - mean_v) for t, v in samples) / spread * 3600


def load(service: Service, key: str, subscriptions: list[dict], stop: threading.Event,
         counts: dict) -> list[threading.Thread]:
    """Pings at PINGS_PER_SECOND over the subscriptions, round robin; reads beside them."""
    partner = Partner(service, key)

    def pinger():
        n = 0
        while not stop.is_set():
            partner.ping(subscriptions[n % len(subscriptions)])
            counts["pings"] += 1
            n += 1
            stop.wait(1 / PINGS_PER_SECOND)

    def reader():
        reading = Partner(service, key)
        while not stop.is_set():
            for path in ("/me", "/webhooks"):
                response = reading.session.get(reading.base + path, timeout=30)
                counts["reads"] += 1
                counts["errors"] += response.status_code >= 500
            stop.wait(0.05)
        reading.close()
    workers = [threading.Thread(target=pinger)] + [threading.Thread(target=reader) for _ in range(READERS)]
    for worker in workers:
        worker.start()
    return workers


def main() -> dict:
    with workdir("soak") as tmp, Receiver() as receiver:
        service = Service(tmp, ENV)
        key = service.create_key(rate_limit=1_000_000)
        with service:
            partner = Partner(service, key)
            subscriptions = [partner.subscribe(receiver.url(path)) for path in paths()]
            worker = service.worker_pid()
            stop, counts = threading.Event(), {"pings": 0, "reads": 0, "errors": 0}
            workers = load(service, key, subscriptions, stop, counts)
            started, samples = time.monotonic(), []
            try:
                while time.monotonic() - started < MINUTES * 60:
                    time.sleep(SAMPLE_SECONDS)
                    samples.append((time.monotonic() - started, memory_kib(worker)["VmRSS"] / 1024,
                                    open_files(worker), threads(worker)))
            finally:
                stop.set()
                for thread in workers:
                    thread.join()
                partner.close()
    warm = [s for s in samples if s[0] >= MINUTES * 60 * WARMUP_FRACTION] or samples
    rss, files, thread_counts = ([(s[0], s[i]) for s in warm] for i in (1, 2, 3))
    figures = [
        below("worker RSS growth after warm-up", max(0.0, slope_per_hour(rss)), "MB/h", 5),
        info("worker RSS at the end", samples[-1][1], "MB"),
        info("open files growth after warm-up", slope_per_hour(files), "files/h"),
        info("threads growth after warm-up", slope_per_hour(thread_counts), "threads/h"),
        info("open files, last sample minus first", samples[-1][2] - samples[0][2], "files"),
        info("threads, last sample minus first", samples[-1][3] - samples[0][3], "threads"),
        info("pings queued", counts["pings"], "events"),
        info("reads answered", counts["reads"], "requests"),
        info("5xx answers", counts["errors"], "responses"),
        info("deliveries that reached a receiver", receiver.count, "requests"),
    ]
    parameters = {"minutes": MINUTES, "quick": QUICK, "subscriptions": "14 healthy / 4 failing / 2 hanging",
                  "pings_per_second": PINGS_PER_SECOND, "sample_seconds": SAMPLE_SECONDS}
    return report("soak", figures, parameters,
                  {"samples_seconds_rss_mb_files_threads": samples})


if __name__ == "__main__":
    main()
