"""The service with a stub resolver in its RESOLVER seam, for bench/dns_isolation.py and
tests/test_tenant_lookups.py: `gunicorn bench.stub_dns_app:app`, served by the repo's gunicorn.conf.py
like the service.

Every `*.bench.test` name is 127.0.0.1, at once. Names under `dead.bench.test` stop answering at all
(a lookup blocks for good, as with a DNS server that drops queries) once the file named by
BENCH_DNS_DEAD_FLAG exists: they resolve while the bench creates their subscriptions, then go dead.
"""

import os
import threading

from app import create_app

_NEVER = threading.Event()


def resolve(host: str) -> list[str]:
    if not host.endswith(".bench.test"):
        raise OSError(f"{host} is not a bench name")
    if host.endswith(".dead.bench.test") and os.path.exists(os.environ["BENCH_DNS_DEAD_FLAG"]):
        _NEVER.wait()
    return ["127.0.0.1"]


app = create_app({"RESOLVER": resolve})
