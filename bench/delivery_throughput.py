"""delivery_throughput: drain a backlog of test pings over 100 subscriptions into a fast receiver,
over HTTP and over HTTPS, and compare with a plain `requests` loop of the same concurrency (one new
connection per request) against the same HTTP receiver.

Both receivers keep connections alive, as partners' servers do. The HTTPS receiver's certificate
comes from a throwaway CA, appended to a production-size trust bundle (requests' default store) that
the service loads through PARTNER_DELIVERY_CA_BUNDLE.

Each backlog is queued once through the API (POST .../test) with the scheduler off; then the service
drains a copy of it, over HTTPS and over HTTP in turn for ROUNDS rounds, and only the drain is
timed: (deliveries - 1) / (last arrival - first arrival), from the receiver's own timestamps, the same
way for the service and for the baseline. Each service figure is the median of its rounds: one drain
moves by a quarter from run to run.
"""

import resource
import shutil
import subprocess
import sys
import tempfile

from harness import (BENCH_DIR, SERVICE_ENV, Receiver, at_least, at_most, copy_of, drain_backlog, info,
                     median_of_rounds, partner_tls, pick, queue_backlog, report, workdir)

EVENTS = pick(10_000, 500)
SUBSCRIPTIONS = 100
# The service's PARTNER_DELIVERY_CONCURRENCY (default 64): the baseline loop gets as many threads.
CONCURRENCY = int(SERVICE_ENV.get("PARTNER_DELIVERY_CONCURRENCY", 64))
DRAIN_TIMEOUT = pick(600, 60)
ROUNDS = pick(3, 1)


def rate(arrivals: list[float]) -> float:
    return (len(arrivals) - 1) / (max(arrivals) - min(arrivals))


def children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def baseline(receiver: Receiver, keep_alive: bool) -> tuple[float, float]:
    """Requests/s of the plain loop, and its CPU milliseconds per request."""
    receiver.reset()
    args = [sys.executable, str(BENCH_DIR / "requests_loop.py"), receiver.url("/ok/baseline"),
            "--count", str(EVENTS), "--threads", str(CONCURRENCY)]
    cpu_before = children_cpu_seconds()
    subprocess.run(args + (["--keep-alive"] if keep_alive else []), check=True, timeout=DRAIN_TIMEOUT,
                   stdout=subprocess.DEVNULL)
    cpu_ms = (children_cpu_seconds() - cpu_before) * 1000 / EVENTS
    receiver.wait_for_count(EVENTS, 10)
    return rate([at for _, at in receiver.arrivals.values()]), cpu_ms


def receiver_alone(receiver: Receiver) -> float | None:
    """wrk, one new connection per request, against the receiver: its own ceiling."""
    if not shutil.which("wrk"):
        return None
    with tempfile.NamedTemporaryFile("w", suffix=".lua") as script:
        script.write('wrk.method = "POST"\nwrk.body = string.rep("x", 320)\n'
                     'wrk.headers["Content-Type"] = "application/json"\n')
        script.flush()
        output = subprocess.run(["wrk", "-t1", f"-c{CONCURRENCY}", f"-d{pick(3, 1)}s", "-s", script.name,
                                 "-H", "Connection: close", receiver.url("/ok/wrk")],
                                capture_output=True, text=True, timeout=30, check=True).stdout
    return float(next(line for line in output.splitlines() if line.startswith("Requests/sec")).split()[1])


def main() -> dict:
    with workdir("throughput") as tmp:
        identity, bundle = partner_tls(tmp)
        with Receiver(tls=identity) as tls_receiver, Receiver() as receiver:
            https_backlog, _ = queue_backlog(tmp, tls_receiver, SUBSCRIPTIONS, EVENTS, database=tmp / "https.sqlite3")
            http_backlog, enqueue_seconds = queue_backlog(tmp, receiver, SUBSCRIPTIONS, EVENTS,
                                                          database=tmp / "http.sqlite3")

            def drain_into(into: Receiver, backlog, env: dict):
                return lambda run: drain_backlog(tmp, into, EVENTS, f"delivery_throughput {run}", env,
                                                 database=copy_of(backlog, run), timeout=DRAIN_TIMEOUT)
            tls = {"PARTNER_DELIVERY_CA_BUNDLE": str(bundle)}
            drains = median_of_rounds({"https": drain_into(tls_receiver, https_backlog, tls),
                                       "http": drain_into(receiver, http_backlog, {})}, ROUNDS)
            (https_rate, https_cpu_ms), (service_rate, service_cpu_ms) = drains["https"], drains["http"]
            plain_rate, plain_cpu_ms = baseline(receiver, keep_alive=False)
            keep_alive_rate, _ = baseline(receiver, keep_alive=True)
            ceiling = receiver_alone(receiver)
    figures = [
        info("service drain over HTTP", service_rate, "deliveries/s"),
        info("service drain over HTTPS", https_rate, "deliveries/s"),
        info(f"plain requests loop, {CONCURRENCY} threads", plain_rate, "requests/s"),
        at_least("ratio HTTPS / HTTP drain", https_rate / service_rate, "", 0.8),
        at_least("ratio HTTP drain / requests loop", service_rate / plain_rate, "", 1.0),
        at_most("service worker CPU per HTTPS delivery", https_cpu_ms, "ms", 3),
        info("service worker CPU per HTTP delivery", service_cpu_ms, "ms"),
        info("requests loop CPU per request", plain_cpu_ms, "ms"),
        info("requests loop with keep-alive (reference)", keep_alive_rate, "requests/s"),
        info("enqueue through the API, 8 clients", EVENTS / enqueue_seconds, "pings/s"),
    ]
    if ceiling is not None:
        figures.append(info("receiver alone (wrk, new connection each)", ceiling, "requests/s"))
    return report("delivery_throughput", figures,
                  {"events": EVENTS, "subscriptions": SUBSCRIPTIONS, "concurrency": CONCURRENCY, "rounds": ROUNDS})


if __name__ == "__main__":
    main()
