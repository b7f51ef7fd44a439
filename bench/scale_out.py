"""scale_out: does a second worker add deliveries, or only waiting? And what does the default
concurrency cost against 8 slots?

One backlog of 3,000 test pings over 30 subscriptions to a fast receiver, queued once with the
scanner off and copied for each run. Each run starts one gunicorn on its copy and times the drain
at the receiver ((deliveries - 1) / (last arrival - first arrival)); the workers' CPU is read
from /proc before they stop. On SQLite (one writer): 1 worker, 2 workers, and 1 worker with
PARTNER_DELIVERY_CONCURRENCY=8.
"""

import shutil
import time

from harness import (Partner, Receiver, Service, at_least, child_pids, cpu_seconds, info, pick, ping_many,
                     report, workdir)

EVENTS = pick(3000, 300)
SUBSCRIPTIONS = 30
DRAIN_TIMEOUT = pick(300, 60)
RUNS = {"1 worker": {}, "2 workers": {"GUNICORN_CMD_ARGS": "--workers 2"},
        "1 worker, 8 slots": {"PARTNER_DELIVERY_CONCURRENCY": "8"}}


def queue_backlog(tmp, receiver: Receiver):
    quiet = Service(tmp, {"PARTNER_SCHEDULER_ENABLED": "false"}, name="enqueue")
    key = quiet.create_key()
    with quiet:
        partner = Partner(quiet, key)
        subscriptions = [partner.subscribe(receiver.url(f"/ok/{n}")) for n in range(SUBSCRIPTIONS)]
        partner.close()
        ping_many(quiet, key, subscriptions, EVENTS)
    return quiet.database


def drain(tmp, receiver: Receiver, backlog, name: str, env: dict) -> tuple[float, float]:
    """Deliveries per second, and worker CPU milliseconds per delivery."""
    database = tmp / f"{name.replace(' ', '-').replace(',', '')}.sqlite3"
    shutil.copy(backlog, database)
    receiver.reset()
    with Service(tmp, env, name=name.replace(" ", "-"), database=database) as service:
        workers = child_pids(service.process.pid)
        cpu_before = sum(cpu_seconds(pid) for pid in workers)
        if not receiver.wait_for_count(EVENTS, DRAIN_TIMEOUT):
            raise RuntimeError(f"{name}: {receiver.count} of {EVENTS} delivered in {DRAIN_TIMEOUT} s")
        time.sleep(0.2)  # the last outcomes are recorded
        cpu = sum(cpu_seconds(pid) for pid in workers) - cpu_before
    arrivals = [at for _, at in receiver.arrivals.values()]
    return (len(arrivals) - 1) / (max(arrivals) - min(arrivals)), cpu * 1000 / EVENTS


def main() -> dict:
    with workdir("scale-out") as tmp, Receiver() as receiver:
        backlog = queue_backlog(tmp, receiver)
        results = {name: drain(tmp, receiver, backlog, name, env) for name, env in RUNS.items()}
    one, two, eight = (results[name][0] for name in RUNS)
    figures = [info(f"{name}: drain", rate, "deliveries/s") for name, (rate, _) in results.items()]
    figures += [info(f"{name}: worker CPU per delivery", cpu, "ms") for name, (_, cpu) in results.items()]
    figures += [at_least("SQLite 2 workers ÷ 1 worker", two / one, "×", 1.5),
                at_least("default concurrency ÷ 8 slots (1 worker)", one / eight, "×", 1.0)]
    return report("scale_out", figures, {"events": EVENTS, "subscriptions": SUBSCRIPTIONS})


if __name__ == "__main__":
    main()
