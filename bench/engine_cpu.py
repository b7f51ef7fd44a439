"""engine_cpu: what one delivery costs the service, and whether a slow receiver costs throughput.

One SQLite worker drains 3,000 pings queued to 30 subscriptions, over HTTP and HTTPS, to a receiver
that answers at once and to one that answers after 200 ms. CPU per delivery is the whole service
process's (gunicorn master and worker, user + system, from /proc) over the drain, divided by the
deliveries; the rate is the receiver's ((deliveries - 1) / (last arrival - first arrival)), and
"steady" the same over the middle 80 % of arrivals (slow start left out); RSS is the worker's peak.

    engine_cpu.py [--slots 64,128,256] [--before DIR] [--runs http-0,https-0,http-200,https-200]

`--slots` repeats each run at those PARTNER_DELIVERY_CONCURRENCY values; `--before` serves the same
runs from another tree as well (e.g. `git worktree add /tmp/before main`), side by side in one run.
"""

import argparse
import time
from contextlib import ExitStack
from pathlib import Path

from harness import (Receiver, Service, copy_of, cpu_seconds, info, memory_kib, partner_tls, pick, profiled,
                     queue_backlog, report, slug, start_scanning, workdir)

EVENTS = pick(3_000, 600)
SUBSCRIPTIONS = 30
DRAIN_TIMEOUT = pick(300, 60)
RUNS = ("http-0", "https-0", "http-200", "https-200")


def drain(tmp: Path, receiver: Receiver, backlog: Path, name: str, env: dict, root: Path | None) -> dict:
    """Drain a copy of `backlog` with one service; its figures."""
    receiver.reset()
    with ExitStack() as running:
        service = Service(tmp, env, name=slug(name), database=copy_of(backlog, name), root=root)
        worker = start_scanning([service], running, name)[0]
        pids = (service.process.pid, worker)
        cpu_before = sum(map(cpu_seconds, pids))
        with profiled(service, slug(name)):
            if not receiver.wait_for_count(EVENTS, DRAIN_TIMEOUT):
                raise RuntimeError(f"{name}: {receiver.count} of {EVENTS} delivered in {DRAIN_TIMEOUT} s")
        time.sleep(0.2)  # the last outcomes are recorded
        cpu = sum(map(cpu_seconds, pids)) - cpu_before
        peak_kib = memory_kib(worker)["VmHWM"]
    arrivals = sorted(at for _, _, at, _, _ in receiver.requests)
    middle = arrivals[len(arrivals) // 10: len(arrivals) * 9 // 10]
    return {"rate": (len(arrivals) - 1) / (arrivals[-1] - arrivals[0]),
            "steady": (len(middle) - 1) / (middle[-1] - middle[0]),
            "cpu_ms": cpu * 1000 / len(arrivals), "rss_mib": peak_kib / 1024}


def main() -> dict:
    parser = argparse.ArgumentParser()
    parser.add_argument("--slots", default="", help="PARTNER_DELIVERY_CONCURRENCY values, comma-separated")
    parser.add_argument("--before", type=Path, help="another tree to serve the same runs from")
    parser.add_argument("--runs", default=",".join(RUNS))
    args = parser.parse_args()
    slots = [None] + [int(n) for n in args.slots.split(",") if n]
    trees = {"after": None, **({"before": args.before.resolve()} if args.before else {})}
    figures, details = [], {}
    with workdir("engine-cpu") as tmp:
        identity, bundle = partner_tls(tmp)
        with Receiver(tls=identity) as tls_receiver, Receiver() as receiver:
            for index, run in enumerate(args.runs.split(",")):  # a run named twice is measured twice
                scheme, delay = run.split("-")
                into = tls_receiver if scheme == "https" else receiver
                path = f"/slow/{delay}" if int(delay) else "/ok"
                backlog, _ = queue_backlog(tmp, into, SUBSCRIPTIONS, EVENTS, database=tmp / f"{run}-{index}.sqlite3",
                                           path=path)
                for count in slots:
                    env = {"PARTNER_DELIVERY_CA_BUNDLE": str(bundle)} if scheme == "https" else {}
                    if count:
                        env["PARTNER_DELIVERY_CONCURRENCY"] = str(count)
                    for tree, root in trees.items():
                        name = (f"{tree} {run} ms" + (f" {count} slots" if count else "")
                                + (f" round {index}" if index else ""))
                        details[name] = result = drain(tmp, into, backlog, name, env, root)
                        print(f"{name}: {result['rate']:.0f}/s steady {result['steady']:.0f}/s "
                              f"{result['cpu_ms']:.3f} ms CPU {result['rss_mib']:.0f} MiB", flush=True)
                        figures += [info(f"{name}: deliveries/s", result["rate"], "/s"),
                                    info(f"{name}: steady deliveries/s", result["steady"], "/s"),
                                    info(f"{name}: CPU per delivery", result["cpu_ms"], "ms"),
                                    info(f"{name}: worker peak RSS", result["rss_mib"], "MiB")]
    return report("engine_cpu", figures, {"events": EVENTS, "subscriptions": SUBSCRIPTIONS, "runs": args.runs,
                                          "slots": args.slots, "before": str(args.before or "")}, details)


if __name__ == "__main__":
    main()
