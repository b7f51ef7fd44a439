"""Forwarded headers, believed only from the proxy.

With PARTNER_TRUSTED_PROXIES ≥ 1 the client address (the failed-authentication budget's key) and
scheme are those the last hops wrote in X-Forwarded-For / -Proto (Werkzeug's ProxyFix). Any client
can write those headers too; only the proxy's are worth believing, so they are read only when the
connection comes from an address in PARTNER_TRUSTED_PROXY_ADDRESSES (by default loopback, where
the kit's nginx connects from). From any other peer they are text a client wrote, and ignored: its
own address is what it is counted under.
"""

from ipaddress import IPv4Network, IPv6Network, ip_address

from werkzeug.middleware.proxy_fix import ProxyFix

Networks = tuple[IPv4Network | IPv6Network, ...]


class ForwardedFromProxies:
    """WSGI middleware: ProxyFix for requests whose peer is a trusted proxy, nothing for the rest."""

    def __init__(self, app, hops: int, proxies: Networks):
        self._app, self._proxies = app, proxies
        self._fixed = ProxyFix(app, x_for=hops, x_proto=hops)

    def __call__(self, environ, start_response):
        handler = self._fixed if is_trusted(environ.get("REMOTE_ADDR"), self._proxies) else self._app
        return handler(environ, start_response)


def is_trusted(peer: str | None, proxies: Networks) -> bool:
    """Whether `peer` (REMOTE_ADDR) lies in one of `proxies`. A unix socket's peer has no address,
    and is not trusted."""
    try:
        address = ip_address(peer or "")
    except ValueError:
        return False
    # gunicorn on an IPv6 socket sees an IPv4 proxy as ::ffff:a.b.c.d.
    address = getattr(address, "ipv4_mapped", None) or address
    return any(address in network for network in proxies)
