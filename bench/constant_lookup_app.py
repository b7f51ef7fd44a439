"""A counterfactual for api_overhead, never a way to run the service: the service exactly as
`wsgi:app` builds it, except that an API key, once found, is answered from memory ever after.

It prices the key lookup's one SQL statement under gunicorn's 8 threads: the sqlite3 module lets
go of the interpreter lock at every step of a statement, and with 8 busy threads each let-go hands
the lock to another thread. The service itself never caches keys, so that a revocation counts on
the very next request, in every process.
"""

import auth
from wsgi import app

_found = {}
_lookup = auth.find_active_key


def _remembered(full_key: str):
    if full_key not in _found:
        _found[full_key] = _lookup(full_key)
    return _found[full_key]


auth.find_active_key = _remembered

__all__ = ["app"]
