"""The auth rule: who is calling (API key) and whether the key may call this endpoint (scope)."""

import functools
import re

from flask import current_app, g, request

from partner.errors import ApiError
from partner.keys import find_active_key

# `Bearer <key>` with the scheme in any case, or the bare key. Basic (and any other scheme) is refused.
_BEARER = re.compile(r"(?:bearer[ \t]+)?(\S+)", re.IGNORECASE)
# The same for every failure (which one is never said), and it says how a key is sent; ASCII, so that
# a raw body (curl) shows it as written.
UNAUTHORIZED_DETAIL = "A valid API key is required, sent as 'Authorization: Bearer vck_...'."


def bearer_key(header: str | None) -> str | None:
    """The key carried by an Authorization header value, or None."""
    match = _BEARER.fullmatch(header.strip()) if header else None
    return match[1] if match else None


def authenticate() -> None:
    """Resolve the calling key into `g.caller` and charge its organization, or raise 401/429."""
    limits = current_app.extensions["rate_limits"]
    key_text = bearer_key(request.headers.get("Authorization"))
    caller = find_active_key(key_text) if key_text else None
    if caller is None:
        # Failed attempts spend the client address's budget, never an organization's.
        limits.charge_failed_login(request.remote_addr)
        raise ApiError(401, "unauthorized", UNAUTHORIZED_DETAIL,
                       headers={"WWW-Authenticate": 'Bearer realm="partner-api"'})
    g.caller = caller
    g.rate_window = limits.charge_organization(caller.organization.id,
                                               caller.organization.rate_limit_per_minute)


def require_scope(scope: str):
    """Decorate a view that needs `scope`; a key without it gets 403 insufficient_scope."""
    def decorator(view):
        @functools.wraps(view)
        def wrapper(*args, **kwargs):
            if scope not in g.caller.scope_set:
                raise ApiError(403, "insufficient_scope", f"This endpoint requires the {scope!r} scope.",
                               headers={"WWW-Authenticate":
                                        f'Bearer error="insufficient_scope", scope="{scope}"'})
            return view(*args, **kwargs)
        wrapper.required_scope = scope
        return wrapper
    return decorator
