"""The service with one cost taken out, for bench/data_costs.py to measure what that cost is:
`gunicorn bench.variant_app:app` with BENCH_VARIANT set, served by the repo's gunicorn.conf.py.

- `normal_commits`: every commit with synchronous=NORMAL, as release 1.1 made them (the service
  makes the acknowledged ones FULL).
- `unsealed_secrets`: claims do not open the sealed webhook secret (AES-GCM); attempts are signed
  with a fixed secret, which the bench's receiver does not check.

Both replace a function before the modules that use it import it: nothing here is a product seam.
"""

import os

from partner import sealing
from partner.store import sql as database

variant = os.environ["BENCH_VARIANT"]
if variant == "normal_commits":
    _write_transaction = database.write_transaction
    database.write_transaction = lambda durable=True: _write_transaction(durable=False)
elif variant == "unsealed_secrets":
    sealing.open_secret = lambda subscription_id, key_id, sealed: "whsec_bench"
else:
    raise SystemExit(f"BENCH_VARIANT={variant!r}: normal_commits or unsealed_secrets")

from app import create_app  # noqa: E402 - after the replacement, so that every module sees it

app = create_app()
