"""publish: platform events in (release 1.4), on one gunicorn worker and SQLite.

- ingest: 10 batches of 500 events to an organization with 10 subscriptions, from 2 client threads,
  nothing delivering: events and deliveries queued per second; again with a schema-checked type;
- the largest write, a batch of 500 to 100 subscriptions (50,000 deliveries in one transaction): its
  time, and the worst wait of another organization's pings sent meanwhile (none may fail);
- the database's growth per 10 KiB event fanned out to 100 subscriptions, beyond the event itself;
- while the service delivers: one publish to 10 subscriptions, its latency; the lag from the 202 to
  each subscription's arrival at 400 deliveries/s steady (every delivery once); the partner API's
  p99 and the delivery rate beside a publisher sending batches of 500;
- drains: 3,000 fan-out deliveries (100 events x 30 subscriptions) against 3,000 pings over the same
  30 subscriptions, each drained alone by one worker, alternating (median of rounds).
"""

import json
import sqlite3
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

from harness import (API, Partner, Receiver, Service, at_least, at_most, below, copy_of, drain_backlog, http_session,
                     info, median_of_rounds, percentile, pick, queue_backlog, report, workdir)

BATCHES, BATCH = pick(10, 4), 500
STEADY_SECONDS = pick(10, 3)
SINGLE_PUBLISHES = pick(300, 40)
DRAIN_EVENTS, DRAIN_SUBSCRIPTIONS, ROUNDS = pick(100, 20), 30, pick(3, 1)
SCHEMA = {"type": "object", "required": ["lead_id"],
          "properties": {"lead_id": {"type": "string"}, "n": {"type": "integer"}}}


class Publisher:
    def __init__(self, service: Service, credential: str):
        self.url = service.base_url + "/internal/v1/events"
        self.session = http_session()
        self.session.headers["Authorization"] = f"Bearer {credential}"

    def post(self, body: dict, batch: bool = False) -> dict:
        response = self.session.post(self.url + ("/batch" if batch else ""), json=body, timeout=60)
        if response.status_code != 202:
            raise RuntimeError(f"publish: {response.status_code} {response.text[:300]}")
        return response.json()


def platform(service: Service, tmp) -> str:
    """Register the bench's types and a publisher; its credential."""
    (tmp / "schema.json").write_text(json.dumps(SCHEMA))
    service.flask("event-types", "add", "bench.plain")
    service.flask("event-types", "add", "bench.checked", "--schema", str(tmp / "schema.json"))
    return service.flask("publishers", "create", "bench").strip().splitlines()[-1]


def events(org: str, kind: str, count: int, size: int = 0) -> list[dict]:
    return [{"organization": org, "event": kind, "data": {"lead_id": f"ld_{n}", "n": n, **({"pad": "x" * size} if size else {})}}
            for n in range(count)]


def ingest(service: Service, credential: str, kind: str) -> float:
    """Events accepted per second: BATCHES batches of BATCH from 2 threads."""
    def send(_):
        publisher = Publisher(service, credential)
        publisher.post({"events": events("bench", kind, BATCH)}, batch=True)
    started = time.monotonic()
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(send, range(BATCHES)))
    return BATCHES * BATCH / (time.monotonic() - started)


def database_bytes(service: Service) -> int:
    connection = sqlite3.connect(service.database)
    try:
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        (pages,), (size,), (free,) = (connection.execute(f"PRAGMA {p}").fetchone()
                                      for p in ("page_count", "page_size", "freelist_count"))
        return (pages - free) * size
    finally:
        connection.close()


def quiet_figures(tmp, receiver) -> list:
    """Ingest, the largest write beside pings, and growth, with nothing delivering."""
    service = Service(tmp, {"PARTNER_SCHEDULER_ENABLED": "false"}, name="quiet", database=tmp / "quiet.sqlite3")
    key, other = service.create_key("bench"), service.create_key("other")
    wide = service.create_key("wide")
    credential = platform(service, tmp)
    with service:
        bench, pinger, widely = Partner(service, key), Partner(service, other), Partner(service, wide)
        for n in range(10):
            bench.subscribe(receiver.url(f"/ok/{n}"))
        for n in range(100):
            widely.subscribe(receiver.url(f"/ok/wide/{n}"))
        target = pinger.subscribe(receiver.url("/ok/pinged"))
        plain, checked = ingest(service, credential, "bench.plain"), ingest(service, credential, "bench.checked")
        before = database_bytes(service)
        growth_events = pick(20, 5)
        Publisher(service, credential).post({"events": events("wide", "bench.plain", growth_events, 10 * 1024)}, batch=True)
        growth = (database_bytes(service) - before) / growth_events - 10 * 1024
        waits, stop = [], threading.Event()

        def ping_meanwhile():
            while not stop.is_set():
                sent = time.monotonic()
                pinger.ping(target)  # raises on any answer but 202
                waits.append((time.monotonic() - sent) * 1000)
        thread = threading.Thread(target=ping_meanwhile)
        thread.start()
        time.sleep(0.2)
        started = time.monotonic()
        Publisher(service, credential).post({"events": events("wide", "bench.plain", BATCH)}, batch=True)
        largest = (time.monotonic() - started) * 1000
        stop.set()
        thread.join()
    return [at_least("ingest, no schema", plain, "events/s", 5000),
            info("ingest, no schema: deliveries queued", plain * 10, "deliveries/s"),
            info("ingest, schema-checked type", checked, "events/s"),
            info("largest publish: 500 events x 100 subscriptions", largest, "ms"),
            below("another organization's ping beside it: worst wait", max(waits), "ms", 1000),
            at_most("growth per 10 KiB event to 100 subscriptions, beyond the event", growth / 1024, "KiB", 100)]


def delivering_figures(tmp, receiver) -> list:
    """With the service delivering: one publish's latency, the steady lag, the API beside batches."""
    service = Service(tmp, name="delivering", database=tmp / "delivering.sqlite3")
    key = service.create_key("bench")
    credential = platform(service, tmp)
    with service:
        partner = Partner(service, key)
        hooks = [partner.subscribe(receiver.url(f"/ok/live/{n}")) for n in range(10)]
        publisher = Publisher(service, credential)
        latencies = []
        for n in range(SINGLE_PUBLISHES):
            started = time.monotonic()
            publisher.post(events("bench", "bench.plain", 1)[0])
            latencies.append((time.monotonic() - started) * 1000)
            time.sleep(0.01)
        receiver.reset()
        sent_at, start = {}, time.monotonic()
        for tick in range(STEADY_SECONDS * 40):  # 40 events/s to 10 subscriptions: 400 deliveries/s
            time.sleep(max(0.0, start + tick / 40 - time.monotonic()))
            sent = time.monotonic()
            sent_at[publisher.post(events("bench", "bench.plain", 1)[0])["id"]] = sent
        published = len(sent_at)
        receiver.wait_for_count(published * 10, 60)
        arrived = Counter((event, path) for event, path, _, status, _ in receiver.requests if status == 200)
        firsts = {}
        for event, path, at, status, _ in receiver.requests:
            firsts.setdefault((event, path), at)
        lags = [(at - sent_at[event]) * 1000 for (event, _), at in firsts.items() if event in sent_at]
        once = len(arrived) == published * 10 and set(arrived.values()) == {1}
        api, stop, receiver_count = [], threading.Event(), receiver.count

        def publish_batches():  # one batch of 500 to 10 subscriptions a second: 5,000 deliveries/s offered
            batcher = Publisher(service, credential)
            while not stop.wait(1.0):
                batcher.post({"events": events("bench", "bench.plain", BATCH)}, batch=True)
        thread = threading.Thread(target=publish_batches)
        started = time.monotonic()
        thread.start()
        failed = 0
        while time.monotonic() - started < STEADY_SECONDS:
            sent = time.monotonic()
            status = partner.session.get(f"{service.base_url}{API}/me", timeout=30).status_code
            failed += status != 200
            partner.ping(hooks[0])
            api.append((time.monotonic() - sent) * 1000)
        stop.set()
        thread.join()
        rate = (receiver.count - receiver_count) / (time.monotonic() - started)
    return [at_most("one publish to 10 subscriptions: p50", percentile(latencies, 50), "ms", 5),
            at_most("one publish to 10 subscriptions: p99", percentile(latencies, 99), "ms", 25),
            at_most("lag 202 → arrival at 400 deliveries/s: p99", percentile(lags, 99), "ms", 1000),
            info("lag 202 → arrival: p50", percentile(lags, 50), "ms"),
            at_least("every delivery once (1 = yes)", int(once), "", 1),
            info("partner /me + ping beside batches of 500: p99", percentile(api, 99), "ms"),
            at_most("partner requests failed beside batches", failed, "requests", 0),
            info("deliveries/s beside batches of 500", rate, "deliveries/s")]


def drain_figures(tmp, receiver) -> list:
    """Fan-out deliveries drained against as many pings over as many subscriptions."""
    total = DRAIN_EVENTS * DRAIN_SUBSCRIPTIONS
    pings, _ = queue_backlog(tmp, receiver, DRAIN_SUBSCRIPTIONS, total, database=tmp / "pings.sqlite3")
    fanned = Service(tmp, {"PARTNER_SCHEDULER_ENABLED": "false"}, name="fanout", database=tmp / "fanout.sqlite3")
    key = fanned.create_key("bench")
    credential = platform(fanned, tmp)
    with fanned:
        partner = Partner(fanned, key)
        for n in range(DRAIN_SUBSCRIPTIONS):
            partner.subscribe(receiver.url(f"/ok/fan/{n}"))
        Publisher(fanned, credential).post({"events": events("bench", "bench.plain", DRAIN_EVENTS)}, batch=True)
    drains = {name: (lambda run, backlog=backlog: drain_backlog(tmp, receiver, total, run, {},
                                                                 database=copy_of(backlog, run)))
              for name, backlog in (("pings", pings), ("fan-out", fanned.database))}
    medians = median_of_rounds(drains, ROUNDS)
    return [info("drain of pings", medians["pings"][0], "deliveries/s"),
            info("drain of fan-out deliveries", medians["fan-out"][0], "deliveries/s"),
            at_least("fan-out ÷ pings drain", medians["fan-out"][0] / medians["pings"][0], "", 0.9),
            info("CPU per delivery: pings / fan-out", medians["pings"][1], "ms"),
            info("CPU per fan-out delivery", medians["fan-out"][1], "ms")]


def main() -> dict:
    with workdir("publish") as tmp, Receiver() as receiver:
        figures = quiet_figures(tmp, receiver) + delivering_figures(tmp, receiver) + drain_figures(tmp, receiver)
    return report("publish", figures, {"batches": BATCHES, "batch": BATCH, "steady_seconds": STEADY_SECONDS,
                                       "drain": f"{DRAIN_EVENTS} events x {DRAIN_SUBSCRIPTIONS} subscriptions"})


if __name__ == "__main__":
    main()
