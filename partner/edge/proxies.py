"""Forwarded headers, believed only from the proxy.

With PARTNER_TRUSTED_PROXIES ≥ 1 the client address (the failed-authentication budget's key) and
scheme are those the last hops wrote in X-Forwarded-For / -Proto (Werkzeug's ProxyFix). Any client
can write those headers too; only the proxy's are worth believing, so they are read only when the
connection comes from an address in PARTNER_TRUSTED_PROXY_ADDRESSES (by default loopback, where
the kit's nginx connects from). From any other peer they are text a client wrote, and ignored: its
own address is what it is counted under. And what the proxy forwards is believed only when it is an
address and a scheme: a header of 6,000 characters of text once reached every access line.
"""

from ipaddress import IPv4Network, IPv6Network, ip_address

from werkzeug.middleware.proxy_fix import ProxyFix

Networks = tuple[IPv4Network | IPv6Network, ...]


class ForwardedFromProxies:
    """WSGI middleware: ProxyFix for requests whose peer is a trusted proxy, nothing for the rest."""

    def __init__(self, app, hops: int, proxies: Networks):
        self._app, self._proxies = app, proxies
        self._fixed = ProxyFix(self._forwarded_checked, x_for=hops, x_proto=hops)

    def __call__(self, environ, start_response):
        handler = self._fixed if is_trusted(environ.get("REMOTE_ADDR"), self._proxies) else self._app
        return handler(environ, start_response)

    def _forwarded_checked(self, environ, start_response):
        """ProxyFix's result, where it is an address and a scheme; the connection's own, where not."""
        original = environ["werkzeug.proxy_fix.orig"]
        if not _is_address(environ.get("REMOTE_ADDR")):
            environ["REMOTE_ADDR"] = original["REMOTE_ADDR"]
        if environ.get("wsgi.url_scheme") not in ("http", "https"):
            environ["wsgi.url_scheme"] = original["wsgi.url_scheme"]
        return self._app(environ, start_response)


def _is_address(text: str | None) -> bool:
    try:
        ip_address(text or "")
    except ValueError:
        return False
    return True


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
