"""concurrency: attempts in flight per subscription, adapted to the receiver (partner/concurrency.py),
at the default settings (one gunicorn worker, PARTNER_DELIVERY_MAX_PER_SUBSCRIPTION 16).

- slow: one subscription whose receiver answers every delivery after 200 ms; 1,500 pings queued
  with the scanner off, then a service drains them. Steady: deliveries/s from the 300th arrival to
  the last (the limit has reached its most by then); whole: from the first.
- capped: a receiver that serves at most 4 at once (200 ms each: 20/s at most) and answers 503 at
  once beyond; 700 pings. First pass: deliveries/s from the first arrival to the last success of an
  event that was never refused (a refused one is retried by the schedule a minute later); the share
  of attempts answered 503; the subscription still active; every event delivered once in the end.
- retry_after: a receiver whose first answer is 429 with `Retry-After: 5`; 20 pings: the time from
  that answer to the next request.
- postgres: two services on one PostgreSQL (a throwaway server, as the tests start one; skipped
  when it is not installed), one subscription answering after 100 ms, 1,000 pings: the most requests
  the receiver had under way against the highest limit the database held, adaptive and pinned to 4.
- cost (also alone: `concurrency.py cost`, with BENCH_SERVICE_ROOT naming another tree to compare):
  scale_out's backlog (3,000 pings over 30 subscriptions to a fast receiver) drained by one service
  on PostgreSQL: write transactions per delivery (transaction ids the server assigned; reads get
  none), rows written per delivery, worker CPU per delivery.

Each limit's course is sampled from the database every SAMPLE_SECONDS during the drain.
"""

import sqlite3
import sys
import threading
import time
from contextlib import ExitStack

from harness import (QUICK, Partner, Receiver, Service, at_least, at_most, cpu_seconds, info, pick, ping_many,
                     queue_backlog, report, start_scanning, throwaway_postgresql, workdir)
from scale_out import rows_written

SLOW_PINGS = pick(1500, 300)
SLOW_MS = 200
STEADY_FROM = pick(300, 100)  # arrivals before this are the limit's ramp
CAPPED_PINGS = pick(700, 200)
CAPPED_AT = 4
RETRY_AFTER_SECONDS = 5
PG_PINGS = pick(1000, 200)
PG_MS = 100
COST_PINGS, COST_SUBSCRIPTIONS = pick(3000, 300), 30
SAMPLE_SECONDS = 0.25
DRAIN_TIMEOUT = pick(300, 120)


def queue(tmp, path: str, pings: int, env: dict | None = None, receiver: Receiver | None = None, name="queue"):
    """One subscription to `receiver`'s `path` with `pings` due pings, queued with the scanner off:
    (the service that queued them, stopped, and the subscription)."""
    quiet = Service(tmp, {"PARTNER_SCHEDULER_ENABLED": "false", **(env or {})}, name=name,
                    database=tmp / f"{name}.sqlite3")
    key = quiet.create_key()
    with quiet:
        partner = Partner(quiet, key)
        subscription = partner.subscribe(receiver.url(path))
        partner.close()
        ping_many(quiet, key, [subscription], pings)
    return quiet, subscription


class Sampler:
    """The subscription's limit, read every SAMPLE_SECONDS on a thread: [(monotonic, limit)]."""

    def __init__(self, read_limit):
        self.read_limit, self.samples = read_limit, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            try:
                self.samples.append((time.monotonic(), self.read_limit()))
            except Exception:  # noqa: BLE001 - a locked moment: the next sample will do
                pass
            self._stop.wait(SAMPLE_SECONDS)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def sqlite_limit(path) -> callable:
    def read():
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1) as connection:
            return connection.execute("SELECT concurrency_limit FROM subscription").fetchone()[0]
    return read


def drain(tmp, services: list[Service], receiver: Receiver, events: int, sampler: Sampler) -> float:
    """Start the services on their queued backlog and wait until `events` are delivered; the
    workers' CPU seconds from the moment every one scans."""
    with ExitStack() as running:
        workers = start_scanning(services, running, services[0].name)
        cpu_before = sum(cpu_seconds(pid) for pid in workers)
        with sampler:
            if not receiver.wait_for_delivered(events, DRAIN_TIMEOUT):
                raise RuntimeError(f"{len(receiver.delivered)} of {events} delivered in {DRAIN_TIMEOUT} s")
            time.sleep(0.3)  # the last outcomes are recorded
        return sum(cpu_seconds(pid) for pid in workers) - cpu_before


def rate(times: list[float]) -> float:
    times = sorted(times)
    return (len(times) - 1) / (times[-1] - times[0])


def course(sampler: Sampler, receiver: Receiver, start: float, seconds: float = 1.0) -> list[dict]:
    """Per `seconds` from `start`: the highest limit sampled, the deliveries and the 503s."""
    rows: dict[int, dict] = {}

    def row(at):
        return rows.setdefault(int((at - start) // seconds), {"limit": 0, "delivered": 0, "refused": 0})
    for at, limit in sampler.samples:
        if at >= start:
            row(at)["limit"] = max(row(at)["limit"], limit)
    for _, _, at, status, _ in receiver.requests:
        row(at)["delivered" if status < 300 else "refused"] += 1
    return [{"second": n * seconds, **rows[n]} for n in sorted(rows)]


def slow(tmp, receiver: Receiver) -> dict:
    receiver.reset()
    quiet, _ = queue(tmp, f"/slow/{SLOW_MS}/one/x", SLOW_PINGS, receiver=receiver, name="slow-queue")
    service = Service(tmp, name="slow", database=quiet.database)
    sampler = Sampler(sqlite_limit(quiet.database))
    cpu = drain(tmp, [service], receiver, SLOW_PINGS, sampler)
    arrivals = sorted(receiver.delivered.values())
    return {"steady": rate(arrivals[STEADY_FROM - 1:]), "whole": rate(arrivals), "cpu_ms": cpu * 1000 / SLOW_PINGS,
            "most_under_way": max(r[4] for r in receiver.requests),
            "course": course(sampler, receiver, arrivals[0])}


def capped(tmp, receiver: Receiver) -> dict:
    receiver.reset()
    quiet, subscription = queue(tmp, f"/capped/{CAPPED_AT}/{SLOW_MS}/x", CAPPED_PINGS, receiver=receiver,
                                name="capped-queue")
    service = Service(tmp, name="capped", database=quiet.database)
    sampler = Sampler(sqlite_limit(quiet.database))
    drain(tmp, [service], receiver, CAPPED_PINGS, sampler)  # the refused ones come back a minute later
    refused = {event_id for event_id, _, _, status, _ in receiver.requests if status == 503}
    first_pass = [at for event_id, at in receiver.delivered.items() if event_id not in refused]
    attempts_before_retries = [r for r in receiver.requests if r[2] <= max(first_pass)]
    listed = service.flask("webhooks", "list").splitlines()
    [row] = [line.split("\t") for line in listed[1:] if line.startswith(subscription["id"])]
    start = min(r[2] for r in receiver.requests)
    return {"first_pass": rate(first_pass),
            "refused_share": sum(r[3] == 503 for r in receiver.requests) / len(receiver.requests),
            "refused_share_first_pass": sum(r[3] == 503 for r in attempts_before_retries) / len(attempts_before_retries),
            "attempts": len(receiver.requests), "refused": len(refused),
            "delivered_once": len(receiver.delivered) == CAPPED_PINGS
            and sum(r[3] == 200 for r in receiver.requests) == CAPPED_PINGS,
            "active": row[3] == "true", "listed": dict(zip(listed[0].split("\t"), row)),
            "most_served_at_once": max(r[4] for r in receiver.requests if r[3] == 200),
            "all_delivered_after": max(receiver.delivered.values()) - start,
            "course": course(sampler, receiver, start)}


def retry_after(tmp, receiver: Receiver) -> float:
    receiver.reset()
    quiet, _ = queue(tmp, f"/retry-after/{RETRY_AFTER_SECONDS}/x", 20, receiver=receiver, name="retry-queue")
    service = Service(tmp, name="retry", database=quiet.database)
    drain(tmp, [service], receiver, 19, Sampler(sqlite_limit(quiet.database)))  # the 429'd one comes later
    [(_, _, refused_at, _, _)] = [r for r in receiver.requests if r[3] == 429]
    return min(r[2] for r in receiver.requests if r[2] > refused_at) - refused_at


def postgres(tmp, receiver: Receiver) -> dict:
    """Two services on one PostgreSQL: adaptive, then pinned to 4."""
    with throwaway_postgresql() as postgresql:
        if postgresql is None:
            return {}
        server, service_env = postgresql
        results = {}
        for pin in (None, 4):
            receiver.reset()
            schema = server.create_schema()
            env = service_env(schema)
            quiet, subscription = queue(tmp, f"/slow/{PG_MS}/pg-{pin or 'auto'}/x", PG_PINGS, env, receiver,
                                        name=f"pg-queue-{pin}")
            if pin:
                quiet.flask("webhooks", "set-concurrency", subscription["id"], str(pin))
            database = server.connect(schema)

            def read_limit():
                return database.execute_sql("SELECT COALESCE(concurrency_pin, concurrency_limit) "
                                            "FROM subscription").fetchone()[0]
            sampler = Sampler(read_limit)
            try:
                drain(tmp, [Service(tmp, env, name=f"pg-{pin}-{n}") for n in range(2)], receiver, PG_PINGS, sampler)
            finally:
                database.close()
            results[pin or "auto"] = {"most_under_way": max(r[4] for r in receiver.requests),
                                      "highest_limit": max(limit for _, limit in sampler.samples),
                                      "rate": rate(list(receiver.delivered.values()))}
        return results


def cost(tmp, receiver: Receiver) -> dict:
    """Write transactions, rows written and worker CPU per delivery: scale_out's backlog, one service
    on PostgreSQL."""
    with throwaway_postgresql() as postgresql:
        if postgresql is None:
            return {}
        server, service_env = postgresql
        schema = server.create_schema()
        env = service_env(schema)
        receiver.reset()
        queue_backlog(tmp, receiver, COST_SUBSCRIPTIONS, COST_PINGS, env)
        database = server.connect(schema)
        try:
            def counters():
                xid = int(database.execute_sql("SELECT txid_current()").fetchone()[0])  # assigns one itself
                return xid, rows_written(server, schema)
            xid_before, rows_before = counters()
            receiver.reset()
            cpu = drain(tmp, [Service(tmp, env, name="cost")], receiver, COST_PINGS, Sampler(lambda: 0))
            time.sleep(1)  # the backends report their row counts when they exit
            xid_after, rows_after = counters()
        finally:
            database.close()
        return {"transactions": (xid_after - xid_before - 1) / COST_PINGS, "rows": (rows_after - rows_before) / COST_PINGS,
                "cpu_ms": cpu * 1000 / COST_PINGS, "rate": rate(list(receiver.delivered.values()))}


def cost_figures(measured: dict) -> list:
    if not measured:
        return []
    return [info("cost: write transactions per delivery (PostgreSQL, 30 subscriptions)", measured["transactions"],
                 "transactions"),
            info("cost: rows written per delivery", measured["rows"], "rows"),
            info("cost: worker CPU per delivery", measured["cpu_ms"], "ms"),
            info("cost: drain", measured["rate"], "deliveries/s")]


def main() -> dict:
    only_cost = sys.argv[1:] == ["cost"]
    with workdir("concurrency") as tmp, Receiver() as receiver:
        if only_cost:
            measured = cost(tmp, receiver)
            return report("concurrency_cost", cost_figures(measured), {"pings": COST_PINGS}, {"cost": measured})
        results = {"slow": slow(tmp, receiver), "capped": capped(tmp, receiver)}
        results["retry_after_gap"] = retry_after(tmp, receiver)
        results["postgres"] = postgres(tmp, receiver)
        results["cost"] = cost(tmp, receiver)
    s, c, pg = results["slow"], results["capped"], results["postgres"]
    figures = [
        at_least(f"slow receiver ({SLOW_MS} ms): steady drain", s["steady"], "deliveries/s", 40),
        info("slow receiver: whole drain, from the first arrival", s["whole"], "deliveries/s"),
        info("slow receiver: most requests under way at the receiver", s["most_under_way"], "requests"),
        info("slow receiver: worker CPU per delivery", s["cpu_ms"], "ms"),
        at_least(f"receiver serving {CAPPED_AT} at once: first-pass drain", c["first_pass"], "deliveries/s", 16),
        at_most("receiver serving 4 at once: attempts answered 503", c["refused_share"] * 100, "%", 5),
        info("receiver serving 4 at once: of the attempts before the retries", c["refused_share_first_pass"] * 100, "%"),
        at_least("receiver serving 4 at once: subscription still active", int(c["active"]), "", 1),
        at_least("receiver serving 4 at once: every event delivered once", int(c["delivered_once"]), "", 1),
        info("receiver serving 4 at once: all delivered, retries included, after", c["all_delivered_after"], "s"),
        at_least(f"429 Retry-After: {RETRY_AFTER_SECONDS}: next attempt after", results["retry_after_gap"], "s",
                 RETRY_AFTER_SECONDS),
    ]
    for mode, measured in pg.items():
        figures += [at_most(f"PostgreSQL, 2 services, {'pinned to 4' if mode == 4 else 'adaptive'}: most under way "
                            "at the receiver, less the highest limit", measured["most_under_way"] - measured["highest_limit"],
                            "requests", 0),
                    info(f"  ... most under way ({mode})", measured["most_under_way"], "requests"),
                    info(f"  ... drain ({mode})", measured["rate"], "deliveries/s")]
    figures += cost_figures(results["cost"])
    return report("concurrency", figures, {"slow_pings": SLOW_PINGS, "capped_pings": CAPPED_PINGS, "capped_at": CAPPED_AT,
                                           "pg_pings": PG_PINGS, "quick": QUICK}, results)


if __name__ == "__main__":
    main()
