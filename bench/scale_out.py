"""scale_out: does a second worker add deliveries, or only waiting? And what does the default
concurrency cost against 8 slots?

One backlog of 3,000 test pings over 30 subscriptions to a fast receiver, queued once with the
scanner off and copied for each run. Each run starts one gunicorn on its copy and times the drain
at the receiver ((deliveries - 1) / (last arrival - first arrival), from the moment every worker
scans); the workers' CPU is read from /proc before they stop. On SQLite (one writer): 1 worker,
2 workers, and 1 worker with PARTNER_DELIVERY_CONCURRENCY=8, taking turns for ROUNDS rounds, each
figure the median of its rounds (a single drain moves by a fifth). On PostgreSQL (a throwaway
server, as the tests start one; skipped when it is not installed): 1 service and 2 services of one
worker each, taking turns for ROUNDS rounds, each draining a backlog queued anew, with the rows
written per delivery from the server's statistics, read once the services have stopped (a backend
reports its counts when it exits). "No higher" allows 1 %: a claim that loses a race to the other
service is written again, a few rows in 3,000 deliveries. Each round is printed with the load it
started under and what does not depend on it: the deadlocks and lock waits the server logged, the
deliveries made twice, the claims that took nothing. Then the start race: a second service starting,
START_TRIALS times, beside one delivering.
"""

import os
import statistics
import threading
import time

from harness import (BOOT_SECONDS, Partner, Receiver, Service, at_least, at_most, drain_backlog, info, median_drains,
                     pick, queue_backlog, report, throwaway_postgresql, workdir)

EVENTS = pick(3000, 300)
SUBSCRIPTIONS = 30
DRAIN_TIMEOUT = pick(300, 60)
RUNS = {"1 worker": ("wsgi:app", {}), "2 workers": ("wsgi:app", {"GUNICORN_CMD_ARGS": "--workers 2"}),
        "1 worker, 8 slots": ("wsgi:app", {"PARTNER_DELIVERY_CONCURRENCY": "8"})}
ROUNDS = pick(5, 1)  # the runs take turns, and each figure is the median of its rounds


# What a PostgreSQL drain is counted by, beside its rate. The server logs every deadlock it ends and,
# with log_lock_waits, every lock waited for longer than deadlock_timeout (1 s). A claim is counted by
# pg_stat_statements (when the server has it): one turn statement per claim that picked something
# (queue.TAKE_TURN), one read of what was taken per claim that took something (queue.CLAIMED);
# the difference is the claims that took nothing: each subscription picked in turn to another claim
# (this process's or another's), or its deliveries taken meanwhile.
LOG_LINES = {"deadlocks": "deadlock detected", "lock waits": "still waiting for"}
CLAIM_STATEMENTS = {"claims": "%pg_try_advisory_xact_lock%", "claims that took": "%AS may_widen%"}
START_TRIALS = pick(20, 3)  # a second service starting while one delivers
RACE_DELIVERIES = 300  # each started service stops once this many more have arrived
# The race's receiver answers after this long: attempts claimed together end together, and their
# outcomes are written in batches of many subscriptions, as in a drain.
RACE_ANSWER_MS = 200


def rows_written(server, schema: str) -> int:
    from partner.store.sql import run_sql_on  # the service's modules: on the path once PostgreSQL runs
    database = server.connect(schema)
    try:
        return int(run_sql_on(database, "SELECT COALESCE(SUM(n_tup_ins + n_tup_upd + n_tup_del), 0) "
                              "FROM pg_stat_user_tables WHERE schemaname = :schema", {"schema": schema}).fetchone()[0])
    finally:
        database.close()


def watched(server) -> bool:
    """Lock waits logged, and statements counted if the server has pg_stat_statements (a restart);
    whether it has."""
    server.execute("ALTER SYSTEM SET log_lock_waits = on")
    if not (server.bin_dir.parent / "lib" / "pg_stat_statements.so").exists():  # contrib not installed
        server.execute("SELECT pg_reload_conf()")
        return False
    server.execute("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
    server.pause()
    server.resume()
    server.execute("CREATE EXTENSION pg_stat_statements")
    return True


def claims_counted(server) -> dict[str, int]:
    """The claims since the last call (CLAIM_STATEMENTS), and the counts start again."""
    database = server.connect("public")
    try:
        counts = {name: int(database.execute_sql("SELECT COALESCE(SUM(calls), 0) FROM pg_stat_statements "
                                                 "WHERE query LIKE %s", (pattern,)).fetchone()[0])
                  for name, pattern in CLAIM_STATEMENTS.items()}
        database.execute_sql("SELECT pg_stat_statements_reset()")
        return counts
    finally:
        database.close()


def logged(server, since: int) -> dict[str, int]:
    """How many lines of each LOG_LINES the server logged after byte `since` of its log."""
    text = (server.root / "postgres.log").read_bytes()[since:].decode(errors="replace")
    return {name: text.count(line) for name, line in LOG_LINES.items()}


def log_size(server) -> int:
    return (server.root / "postgres.log").stat().st_size


def postgres_drain(tmp, receiver: Receiver, server, service_env, services: int, name: str, counted: bool) -> dict:
    """One drain of a new backlog by `services` services: its rate, worker CPU and rows written per
    delivery, the load when it started, what the server logged, deliveries made twice, the claims."""
    schema = server.create_schema()
    env = service_env(schema)
    queue_backlog(tmp, receiver, SUBSCRIPTIONS, EVENTS, env)
    before, since = rows_written(server, schema), log_size(server)
    if counted:
        claims_counted(server)
    load = os.getloadavg()[0]
    rate, cpu = drain_backlog(tmp, receiver, EVENTS, name, env, services=services, timeout=DRAIN_TIMEOUT)
    sent = [event_id for event_id, *_ in receiver.requests]
    claims = claims_counted(server) if counted else {}
    return {"rate": rate, "cpu": cpu, "rows": (rows_written(server, schema) - before) / EVENTS, "load": load,
            **logged(server, since), "deliveries made twice": len(sent) - len(set(sent)),
            **({"claims": claims["claims"], "empty claims": claims["claims"] - claims["claims that took"]}
               if claims else {})}


def postgres_rounds(tmp, receiver: Receiver, server, service_env, counted: bool) -> list[dict[int, dict]]:
    """ROUNDS rounds of a drain by 1 service and one by 2, taking turns as the SQLite runs do."""
    rounds = []
    for round_ in range(ROUNDS):
        order = (1, 2) if round_ % 2 == 0 else (2, 1)
        rounds.append({services: postgres_drain(tmp, receiver, server, service_env, services,
                                                f"PostgreSQL {services} {round_}", counted) for services in order})
    return rounds


def start_race(tmp, receiver: Receiver, server, service_env) -> dict[str, int]:
    """A service delivering test pings fed without pause while a second one starts, delivers and stops,
    START_TRIALS times: the starts that failed, the pings refused, and what the server logged meanwhile."""
    env = service_env(server.create_schema())
    delivering = Service(tmp, env, name="delivering")
    key = delivering.create_key()
    failed, since, stop, refused = 0, log_size(server), threading.Event(), []
    with delivering:
        partner = Partner(delivering, key)
        hooks = [partner.subscribe(receiver.url(f"/slow/{RACE_ANSWER_MS}/race/{n}")) for n in range(SUBSCRIPTIONS)]
        partner.close()
        feeders = [threading.Thread(target=feed, args=(delivering, key, hooks[n::4], stop, refused)) for n in range(4)]
        for feeder in feeders:
            feeder.start()
        try:
            for trial in range(START_TRIALS):
                try:
                    with Service(tmp, env, name=f"starting-{trial}") as starting:
                        wait_for_scanner(starting, receiver)
                except RuntimeError:
                    failed += 1
        finally:
            stop.set()
            for feeder in feeders:
                feeder.join()
    return {"failed starts": failed, "pings refused": len(refused), **logged(server, since)}


def wait_for_scanner(service: Service, receiver: Receiver) -> None:
    """Until the service's scanner runs and RACE_DELIVERIES more deliveries have arrived (both services
    deliver meanwhile); RuntimeError if not within BOOT_SECONDS."""
    deadline = time.monotonic() + BOOT_SECONDS
    while not service.scanners_started():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{service.name}: its scanner did not start")
        time.sleep(0.01)
    if not receiver.wait_for_count(receiver.count + RACE_DELIVERIES, BOOT_SECONDS):
        raise RuntimeError(f"{service.name}: nothing delivered while it ran")


def feed(service: Service, key: str, hooks: list[dict], stop: threading.Event, refused: list) -> None:
    """Ping `hooks` in turn until `stop`; each answer but 202 is added to `refused`."""
    partner = Partner(service, key)
    try:
        while not stop.is_set():
            for hook in hooks:
                try:
                    partner.ping(hook)
                except RuntimeError as error:  # the answer was not 202
                    refused.append(str(error).splitlines()[0])
    finally:
        partner.close()


def postgres_runs(tmp, receiver: Receiver) -> tuple[list[dict[int, dict]], dict[str, int]] | None:
    """The drains' rounds and the start race, on a throwaway server; None when PostgreSQL is not installed."""
    with throwaway_postgresql() as postgresql:
        if postgresql is None:
            return None
        server, service_env = postgresql
        counted = watched(server)
        return (postgres_rounds(tmp, receiver, server, service_env, counted),
                start_race(tmp, receiver, server, service_env))


def postgres_figures(rounds: list[dict[int, dict]], race: dict[str, int]) -> list:
    """Each round printed (its load, what the server logged, the claims); the figures over them all."""
    ratios = [drains[2]["rate"] / drains[1]["rate"] for drains in rounds]
    for round_, (drains, ratio) in enumerate(zip(rounds, ratios)):
        print(f"PostgreSQL round {round_}: 2 services ÷ 1 = {ratio:.3f}; "
              + "; ".join(f"{services}: " + ", ".join(f"{name} {value:.3g}" for name, value in drain.items())
                          for services, drain in drains.items()))
    total = {n: {name: sum(drains[n][name] for drains in rounds) for name in rounds[0][n]} for n in (1, 2)}
    median = {n: {name: statistics.median(drains[n][name] for drains in rounds) for name in ("rate", "rows")}
              for n in (1, 2)}
    figures = [info(f"{_services(n)}: {name} (all rounds)", value, "") for n in (1, 2)
               for name, value in total[n].items() if name in ("lock waits", "claims", "empty claims")]
    figures += [info(f"{_services(n)}: drain (median)", median[n]["rate"], "deliveries/s") for n in (1, 2)]
    figures += [info(f"{_services(n)}: rows written per delivery (median)", median[n]["rows"], "rows") for n in (1, 2)]
    figures += [at_least("PostgreSQL 2 services ÷ 1 service (median of rounds)", statistics.median(ratios), "×", 1.3),
                at_least("PostgreSQL 2 services ÷ 1 service (lowest round)", min(ratios), "×", 1.0),
                at_most("PostgreSQL rows written per delivery, 2 services ÷ 1", median[2]["rows"] / median[1]["rows"],
                        "×", 1.01)]
    figures += [at_most(f"PostgreSQL drains: {name}", total[1][name] + total[2][name], "", 0)
                for name in ("deadlocks", "deliveries made twice")]
    race_name = f"PostgreSQL start race ({START_TRIALS} starts)"
    figures += [at_most(f"{race_name}: {name}", value, "", 0) for name, value in race.items() if name != "lock waits"]
    return figures + [info(f"{race_name}: lock waits", race["lock waits"], "")]


def _services(n: int) -> str:
    return f"PostgreSQL, {n} service{'s' if n > 1 else ''}"


def main() -> dict:
    with workdir("scale-out") as tmp, Receiver() as receiver:
        backlog, _ = queue_backlog(tmp, receiver, SUBSCRIPTIONS, EVENTS)
        results = median_drains(tmp, receiver, EVENTS, backlog, RUNS, ROUNDS, DRAIN_TIMEOUT)
        postgres = postgres_runs(tmp, receiver)
    one, two, eight = (results[name][0] for name in RUNS)
    figures = [info(f"{name}: drain", rate, "deliveries/s") for name, (rate, _) in results.items()]
    figures += [info(f"{name}: worker CPU per delivery", cpu, "ms") for name, (_, cpu) in results.items()]
    figures += [at_least("SQLite 2 workers ÷ 1 worker", two / one, "×", 1.5),
                at_least("default concurrency ÷ 8 slots (1 worker)", one / eight, "×", 1.0)]
    details = {}
    if postgres:
        figures += postgres_figures(*postgres)
        details = {"PostgreSQL rounds": postgres[0], "PostgreSQL start race": postgres[1]}
    return report("scale_out", figures, {"events": EVENTS, "subscriptions": SUBSCRIPTIONS, "rounds": ROUNDS}, details)


if __name__ == "__main__":
    main()
