"""One organization cannot exhaust the worker's file descriptors (issue 41), through a real gunicorn
under systemd's default limit of 1,024: the attacker creates 64 subscriptions to one port, pings each
once and deletes them, port after port, over 16 keep-alive ports (1,024 cycles), while two other
organizations ping. The worker's descriptors stay well under the limit, it never dies, the others'
pings are all delivered with nothing counted against them, and /healthz and /readyz answer throughout."""

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from tests.gunicorn_server import STOP_SECONDS, Gunicorn, Partner, flask, open_files_limit
from tests.support import eventually, free_port, open_database

NOFILE = 1024  # systemd's default LimitNOFILE, which the shipped unit once left in place
CEILING = 600  # the worker's descriptors stay under this, however the attacker's targets churn
PORTS = 16
BATCH = 64  # subscriptions to one port at once: their attempts overlap, so each has a connection
ANSWER_SECONDS = 0.3  # how long the attacker's receivers take: long enough for a batch to overlap
CLIENTS = 8  # the attacker's calls in flight, as many as gunicorn's request threads
VICTIMS = ("partner-a", "partner-b")


class Watch:
    """Samples the worker's open descriptors and asks /healthz and /readyz on the ops port, until
    stopped: `peak` descriptors, and `problems` (a probe not answered 200, the worker gone)."""

    def __init__(self, worker: int, ops_url: str):
        self.worker, self.ops_url = worker, ops_url
        self.peak, self.problems = 0, []
        self.stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with requests.Session() as http:
            http.trust_env = False
            while not self.stopped.wait(0.05):
                try:
                    self.peak = max(self.peak, len(os.listdir(f"/proc/{self.worker}/fd")))
                except FileNotFoundError:
                    self.problems.append("the worker died")
                    return
                for path in ("/healthz", "/readyz"):
                    try:
                        status = http.get(self.ops_url + path, timeout=5).status_code
                    except requests.RequestException as error:
                        status = error
                    if status != 200:
                        self.problems.append(f"{path}: {status}")

    @property
    def healthy(self) -> bool:
        return self.peak < CEILING and not self.problems

    def stop(self) -> None:
        self.stopped.set()
        self._thread.join()


@pytest.fixture
def service(server_env, tmp_path, session):
    """(the running service under NOFILE, its ops URL, a Partner for the attacker and each victim)."""
    ops_port = free_port()
    server_env.update(PARTNER_WEBHOOK_ALLOWED_NETWORKS='["127.0.0.0/8"]', PARTNER_OPS_PORT=str(ops_port))
    open_database(server_env["PARTNER_DATABASE_URL"]).close_all()  # as the service's first start makes it
    keys = {org: flask(server_env, "keys", "create", "--org", org, "--scope", "webhooks:manage")
            for org in ("attacker", *VICTIMS)}
    flask(server_env, "orgs", "set-limit", "attacker", "1000000")
    server = Gunicorn(server_env, tmp_path / "gunicorn", launcher=open_files_limit(NOFILE))
    try:
        server.wait_until_serving(session)
        yield server, f"http://127.0.0.1:{ops_port}", {org: Partner(server.base_url, key)
                                                       for org, key in keys.items()}
    finally:
        server.process.kill()
        server.process.wait(timeout=STOP_SECONDS)


def test_one_organizations_churn_of_targets_leaves_the_worker_descriptors_and_the_others_deliveries(
        service, keep_alive_ports, start_receiver):
    server, ops_url, organizations = service
    attacker, attacker_receivers = organizations["attacker"], keep_alive_ports(PORTS, delay=ANSWER_SECONDS)
    receiver = start_receiver()
    victims = {org: organizations[org].subscribe(receiver.url) for org in VICTIMS}
    [worker] = server.worker_pids()
    watch, pinged, sent = Watch(worker, ops_url), set(), 0
    try:
        with ThreadPoolExecutor(CLIENTS) as calls:
            for port in attacker_receivers.ports:
                batch = list(calls.map(attacker.subscribe, [f"http://127.0.0.1:{port}/hook/{n}" for n in range(BATCH)]))
                list(calls.map(attacker.ping, batch))
                sent += len(batch)
                pinged |= {organizations[org].ping(subscription) for org, subscription in victims.items()}
                # Deleted once delivered: each attempt took a connection of its own to the port.
                eventually(lambda: len(attacker_receivers.events) >= sent, seconds=10)
                list(calls.map(attacker.delete, batch))
                if not watch.healthy:
                    break
        delivered = eventually(lambda: pinged <= {r.headers["X-VC-Event-Id"] for r in receiver.received}, 15)
    finally:
        watch.stop()
    assert watch.peak < CEILING, f"the worker held {watch.peak} descriptors"
    assert watch.problems == []
    assert server.process.poll() is None and server.worker_pids() == [worker]
    assert sent == PORTS * BATCH and delivered
    for org, subscription in victims.items():
        assert organizations[org].get(f"/{subscription['id']}/failures")["data"] == []
        assert [s["consecutive_failures"] for s in organizations[org].get("")["data"]] == [0]
