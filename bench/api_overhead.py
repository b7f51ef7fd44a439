"""api_overhead: throughput of GET /me and GET /webhooks against a bare Flask JSON endpoint served by
the same gunicorn config, measured alternately in one run with the same wrk parameters.

The service adds authentication (the API key, read from the database on every request), the
per-organization rate limit, request ids, metrics and the JSON shaping; the ratio to the bare
endpoint is that overhead. The worker's context switches
per request show what a read from SQLite costs under 8 threads: the sqlite3 module lets go of the
interpreter lock at each step of a statement, and each let-go hands it to another thread.
Beside them, GET /me while another process commits COMMITS_PER_SECOND times a second, as deliveries
do: what the engine's writes cost the API's reads.
Without wrk (BENCH_QUICK=1 only) a Python keep-alive client stands in: its figures prove the bench
runs, not how fast the service is, because the client saturates before the server does.
"""

import http.client
import re
import shutil
import sqlite3
import threading
import time
from contextlib import contextmanager, nullcontext

from harness import (API, QUICK, REPO, Partner, Receiver, Service, at_least, context_switches, cpu_seconds,
                     info, pick, report, run_threads, workdir)

SUBSCRIPTIONS = 10  # GET /webhooks lists them all (one page)
CONNECTIONS = 16
SECONDS = pick(10, 1)  # wrk takes whole seconds
WARMUP_SECONDS = pick(2, 1)
ROUNDS = pick(3, 1)  # alternate the endpoints this many times; the median counts
COMMITS_PER_SECOND = 100  # about what 100 deliveries a second write


def wrk(url: str, headers: dict, seconds: float) -> float:
    """Requests/s from wrk; every response must be 2xx."""
    import subprocess
    args = ["wrk", "-t1", f"-c{CONNECTIONS}", f"-d{seconds}s", "--latency"]
    for name, value in headers.items():
        args += ["-H", f"{name}: {value}"]
    output = subprocess.run(args + [url], capture_output=True, text=True, timeout=seconds + 60,
                            check=True).stdout
    if "Non-2xx" in output or "Socket errors" in output:
        raise RuntimeError(f"wrk saw errors against {url}:\n{output}")
    return float(re.search(r"Requests/sec:\s+([\d.]+)", output)[1])


def python_load(url: str, headers: dict, seconds: float) -> float:
    """A stand-in for wrk: CONNECTIONS keep-alive clients in threads (quick mode only)."""
    host, port, path = re.match(r"http://([^:/]+):(\d+)(/.*)", url).groups()
    counts, deadline = [0] * CONNECTIONS, time.monotonic() + seconds

    def client(n: int) -> None:
        connection = http.client.HTTPConnection(host, int(port), timeout=10)
        while time.monotonic() < deadline:
            connection.request("GET", path, headers=headers)
            response = connection.getresponse()
            response.read()
            if response.status != 200:
                raise RuntimeError(f"{url}: {response.status}")
            counts[n] += 1
        connection.close()

    started = time.monotonic()
    run_threads(client, CONNECTIONS)
    return sum(counts) / (time.monotonic() - started)


@contextmanager
def commits_from_another_process(database, per_second: int):
    """Commit a small write `per_second` times a second (another connection, like another process's)."""
    stop = threading.Event()

    def commit() -> None:
        connection = sqlite3.connect(database, timeout=5)
        while not stop.wait(1 / per_second):
            connection.execute("INSERT INTO setting (name, value) VALUES ('bench', :value) ON CONFLICT (name) "
                               "DO UPDATE SET value = excluded.value", {"value": str(time.monotonic())})
            connection.commit()
        connection.close()

    writer = threading.Thread(target=commit, daemon=True)
    writer.start()
    try:
        yield
    finally:
        stop.set()
        writer.join()


def main() -> dict:
    generator = wrk if shutil.which("wrk") else None
    if generator is None:
        if not QUICK:
            raise SystemExit("api_overhead needs wrk: run `bash bench/setup.sh` (apt-get install wrk)")
        generator = python_load
    with workdir("api") as tmp, Receiver() as receiver:
        service = Service(tmp)
        key = service.create_key()
        # PYTHONPATH: bench/ lives in this repo, whatever tree BENCH_SERVICE_ROOT points at.
        bare = Service(tmp, {"PYTHONPATH": str(REPO)}, app="bench.bare_app:app", name="bare")
        with service, bare:
            partner = Partner(service, key)
            for n in range(SUBSCRIPTIONS):
                partner.subscribe(receiver.url(f"/ok/{n}"))
            partner.close()
            auth = {"Authorization": f"Bearer {key}"}
            endpoints = {"bare": (bare, bare.base_url + "/bare", {}),
                         "me": (service, service.base_url + API + "/me", auth),
                         "webhooks": (service, service.base_url + API + "/webhooks", auth),
                         "me_while_committing": (service, service.base_url + API + "/me", auth)}
            for _, url, headers in endpoints.values():
                generator(url, headers, WARMUP_SECONDS)
            runs = {name: [] for name in endpoints}
            cpu = {name: [] for name in endpoints}  # the worker's CPU ms per request
            switches = {name: [] for name in endpoints}  # the worker's context switches per request
            for _ in range(ROUNDS):
                for name, (server, url, headers) in endpoints.items():
                    worker = server.worker_pid()
                    cpu_before, switches_before = cpu_seconds(worker), context_switches(worker)
                    started = time.monotonic()
                    with (commits_from_another_process(service.database, COMMITS_PER_SECOND)
                          if name == "me_while_committing" else nullcontext()):
                        runs[name].append(generator(url, headers, SECONDS))
                    requests = runs[name][-1] * (time.monotonic() - started)
                    cpu[name].append((cpu_seconds(worker) - cpu_before) * 1000 / requests)
                    switches[name].append((context_switches(worker) - switches_before) / requests)
    rate, cpu_ms, switched = ({name: sorted(values)[len(values) // 2] for name, values in measured.items()}
                              for measured in (runs, cpu, switches))
    figures = [
        info("bare Flask JSON endpoint", rate["bare"], "requests/s"),
        info("GET /me", rate["me"], "requests/s"),
        info("GET /webhooks (10 subscriptions)", rate["webhooks"], "requests/s"),
        at_least("ratio GET /me / bare", rate["me"] / rate["bare"], "", 0.75),
        at_least("ratio GET /webhooks / bare", rate["webhooks"] / rate["bare"], "", 0.60),
        info("worker CPU per request, bare", cpu_ms["bare"], "ms"),
        info("worker CPU per request, GET /me", cpu_ms["me"], "ms"),
        info("worker CPU per request, GET /webhooks", cpu_ms["webhooks"], "ms"),
        info("context switches per request, bare", switched["bare"], ""),
        info("context switches per request, GET /me", switched["me"], ""),
        info("context switches per request, GET /webhooks", switched["webhooks"], ""),
        info(f"GET /me while {COMMITS_PER_SECOND} commits/s land / bare", rate["me_while_committing"] / rate["bare"], ""),
        info("its worker CPU per request", cpu_ms["me_while_committing"], "ms"),
        info("its context switches per request", switched["me_while_committing"], ""),
    ]
    load_generator = "wrk -t1" if generator is wrk else "python (quick fallback: not comparable)"
    parameters = {"load_generator": load_generator, "connections": CONNECTIONS, "seconds": SECONDS,
                  "rounds": ROUNDS, "commits_per_second": COMMITS_PER_SECOND}
    return report("api_overhead", figures, parameters,
                  {"runs_requests_per_s": runs, "runs_cpu_ms_per_request": cpu,
                   "runs_context_switches_per_request": switches})


if __name__ == "__main__":
    main()
