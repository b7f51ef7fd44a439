"""memory: peak RSS of the gunicorn worker (the process that serves and delivers) while a backlog
of due deliveries drains into the fast receiver.

The backlog is written before the server starts, with the service's own `events.enqueue_test_ping`
inside `create_app(...)` (the scheduler is off there): quick to build, and the same rows a
POST .../test writes. The worker is found as the gunicorn master's one child; its VmHWM (peak
resident set) is read from /proc when the last delivery has arrived.
"""

import sys
import time

from harness import (SERVICE_ROOT, Partner, Receiver, Service, below, info, memory_kib, pick, report,
                     workdir)

EVENTS = pick(10_000, 500)
SUBSCRIPTIONS = 100
DRAIN_TIMEOUT = pick(600, 60)


def queue_backlog(service: Service, receiver: Receiver, events: int) -> None:
    """Create SUBSCRIPTIONS subscriptions through the API, then `events` due test pings in the database."""
    key = service.create_key()
    quiet = Service(service.workdir, {"PARTNER_SCHEDULER_ENABLED": "false"}, name="setup",
                    database=service.database)
    with quiet:
        partner = Partner(quiet, key)
        ids = [partner.subscribe(receiver.url(f"/ok/{n}"))["id"] for n in range(SUBSCRIPTIONS)]
        partner.close()
    sys.path.insert(0, str(SERVICE_ROOT))
    from app import create_app
    from models import Subscription, db
    try:
        from partner.events import enqueue_test_ping
    except ImportError:  # before events.py was split out of the outbox
        from partner.outbox import enqueue_test_ping

    create_app({"DATABASE_URL": f"sqlite:///{service.database}", "SCHEDULER_ENABLED": False})
    now_ms = int(time.time() * 1000)
    with db.connection_context(), db.atomic():
        subscriptions = [Subscription.get_by_id(id) for id in ids]
        for n in range(events):
            enqueue_test_ping(subscriptions[n % SUBSCRIPTIONS], "bench", now_ms)
    getattr(db.obj, "close_all", db.close)()  # pooled: close every connection, not just this thread's


def main() -> dict:
    with workdir("memory") as tmp, Receiver() as receiver:
        service = Service(tmp)
        queue_backlog(service, receiver, EVENTS)
        receiver.reset()
        with service:
            worker = service.worker_pid()
            samples = []
            deadline = time.monotonic() + DRAIN_TIMEOUT
            while not receiver.wait_for_count(EVENTS, 0.25) and time.monotonic() < deadline:
                samples.append(memory_kib(worker)["VmRSS"])
            drained = receiver.count >= EVENTS
            final = memory_kib(worker)
            master = memory_kib(service.process.pid)
    if not drained:
        raise RuntimeError(f"only {receiver.count} of {EVENTS} deliveries within {DRAIN_TIMEOUT} s")
    figures = [
        below("worker peak RSS (VmHWM) while draining", final["VmHWM"] / 1024, "MB", 150),
        info("worker RSS after the drain", final["VmRSS"] / 1024, "MB"),
        info("worker RSS, first sample", (samples or [final["VmRSS"]])[0] / 1024, "MB"),
        info("gunicorn master peak RSS", master["VmHWM"] / 1024, "MB"),
    ]
    return report("memory", figures, {"events": EVENTS, "subscriptions": SUBSCRIPTIONS},
                  {"worker_rss_samples_kib": samples})


if __name__ == "__main__":
    main()
