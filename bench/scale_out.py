"""scale_out: does a second worker add deliveries, or only waiting? And what does the default
concurrency cost against 8 slots?

One backlog of 3,000 test pings over 30 subscriptions to a fast receiver, queued once with the
scanner off and copied for each run. Each run starts one gunicorn on its copy and times the drain
at the receiver ((deliveries - 1) / (last arrival - first arrival), from the moment every worker
scans); the workers' CPU is read from /proc before they stop. On SQLite (one writer): 1 worker,
2 workers, and 1 worker with PARTNER_DELIVERY_CONCURRENCY=8, taking turns for ROUNDS rounds, each
figure the median of its rounds (a single drain moves by a fifth). On PostgreSQL (a throwaway
server, as the tests start one; skipped when it is not installed): 1 service and 2 services of one worker each, each draining a backlog
queued anew, with the rows written per delivery from the server's statistics, read once the
services have stopped (a backend reports its counts when it exits). "No higher" allows 1 %: a
claim that loses a race to the other service is written again, a few rows in 3,000 deliveries.
"""

from harness import (Receiver, at_least, at_most, drain_backlog, info, median_drains, pick, queue_backlog,
                     report, throwaway_postgresql, workdir)

EVENTS = pick(3000, 300)
SUBSCRIPTIONS = 30
DRAIN_TIMEOUT = pick(300, 60)
RUNS = {"1 worker": ("wsgi:app", {}), "2 workers": ("wsgi:app", {"GUNICORN_CMD_ARGS": "--workers 2"}),
        "1 worker, 8 slots": ("wsgi:app", {"PARTNER_DELIVERY_CONCURRENCY": "8"})}
ROUNDS = pick(5, 1)  # the SQLite runs take turns, and each figure is the median of its rounds


def rows_written(server, schema: str) -> int:
    from partner.store.sql import run_sql_on  # the service's modules: on the path once PostgreSQL runs
    database = server.connect(schema)
    try:
        return int(run_sql_on(database, "SELECT COALESCE(SUM(n_tup_ins + n_tup_upd + n_tup_del), 0) "
                              "FROM pg_stat_user_tables WHERE schemaname = :schema", {"schema": schema}).fetchone()[0])
    finally:
        database.close()


def postgres_runs(tmp, receiver: Receiver) -> dict[str, tuple[float, float, float]]:
    """Drain, worker CPU per delivery and rows written per delivery of 1 and 2 services."""
    with throwaway_postgresql() as postgresql:
        if postgresql is None:
            return {}
        server, service_env = postgresql
        results = {}
        for services in (1, 2):
            schema = server.create_schema()
            env = service_env(schema)
            queue_backlog(tmp, receiver, SUBSCRIPTIONS, EVENTS, env)
            before = rows_written(server, schema)
            name = f"PostgreSQL, {services} service{'s' if services > 1 else ''}"
            rate, cpu = drain_backlog(tmp, receiver, EVENTS, name, env, services=services, timeout=DRAIN_TIMEOUT)
            results[name] = (rate, cpu, (rows_written(server, schema) - before) / EVENTS)
        return results


def main() -> dict:
    with workdir("scale-out") as tmp, Receiver() as receiver:
        backlog, _ = queue_backlog(tmp, receiver, SUBSCRIPTIONS, EVENTS)
        results = median_drains(tmp, receiver, EVENTS, backlog, RUNS, ROUNDS, DRAIN_TIMEOUT)
        postgres = postgres_runs(tmp, receiver)
    one, two, eight = (results[name][0] for name in RUNS)
    figures = [info(f"{name}: drain", rate, "deliveries/s") for name, (rate, *_) in {**results, **postgres}.items()]
    figures += [info(f"{name}: worker CPU per delivery", cpu, "ms")
                for name, (_, cpu, *_) in {**results, **postgres}.items()]
    figures += [at_least("SQLite 2 workers ÷ 1 worker", two / one, "×", 1.5),
                at_least("default concurrency ÷ 8 slots (1 worker)", one / eight, "×", 1.0)]
    if postgres:
        (one_pg, _, rows_one), (two_pg, _, rows_two) = postgres.values()
        figures += [info(f"{name}: rows written per delivery", rows, "rows") for name, (_, _, rows) in postgres.items()]
        figures += [at_least("PostgreSQL 2 services ÷ 1 service", two_pg / one_pg, "×", 1.0),
                    at_most("PostgreSQL rows written per delivery, 2 services ÷ 1", rows_two / rows_one, "×", 1.01)]
    return report("scale_out", figures, {"events": EVENTS, "subscriptions": SUBSCRIPTIONS, "SQLite rounds": ROUNDS})


if __name__ == "__main__":
    main()
