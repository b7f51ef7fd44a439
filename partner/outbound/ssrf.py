"""May we send to this URL? The one place that answers (docs/security.md lists the internal targets)."""

from __future__ import annotations

import functools
import re
import socket
import unicodedata
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network, ip_address, ip_network
from urllib.parse import urlsplit

import idna
from urllib3.exceptions import LocationParseError
from urllib3.util import parse_url

Resolver = Callable[[str], Sequence[str]]
Network = IPv4Network | IPv6Network
Address = IPv4Address | IPv6Address

MAX_URL_LENGTH = 2048
SCHEMES = {"http": 80, "https": 443}

# IANA IPv4 Special-Purpose Address Registry, plus multicast, reserved and cloud platform endpoints:
# never delivered to.
BLOCKED_IPV4 = tuple(ip_network(n) for n in (
    "0.0.0.0/8",        # "this network"
    "10.0.0.0/8",       # private
    "100.64.0.0/10",    # shared address space (CGNAT)
    "127.0.0.0/8",      # loopback
    "169.254.0.0/16",   # link-local, cloud metadata
    "172.16.0.0/12",    # private
    "192.0.0.0/24",     # IETF protocol assignments
    "192.0.2.0/24",     # TEST-NET-1
    "192.88.99.0/24",   # deprecated 6to4 relay anycast
    "192.168.0.0/16",   # private
    "198.18.0.0/15",    # benchmarking
    "198.51.100.0/24",  # TEST-NET-2
    "203.0.113.0/24",   # TEST-NET-3
    "224.0.0.0/4",      # multicast
    "240.0.0.0/4",      # reserved, including limited broadcast
    # Cloud platform endpoints on routable addresses.
    "168.63.129.16/32",  # Azure WireServer (and its DNS, DHCP and health probes)
))

# Only global unicast may pass, minus the special-purpose blocks inside it.
GLOBAL_UNICAST_IPV6 = ip_network("2000::/3")
BLOCKED_IPV6 = tuple(ip_network(n) for n in (
    "2001::/23",        # IETF protocol assignments, including Teredo 2001::/32
    "2001:db8::/32",    # documentation
    "2002::/16",        # 6to4: embeds any IPv4, so blocked whole
    "3fff::/20",        # documentation
))

# IPv6 forms that carry an IPv4 address. All lie outside 2000::/3, so they are blocked whatever
# IPv4 they carry: at least as strict as judging the IPv4 inside.
IPV4_EMBEDDING_IPV6 = tuple(ip_network(n) for n in (
    "::ffff:0:0/96",      # IPv4-mapped
    "::/96",              # IPv4-compatible (deprecated)
    "::ffff:0:0:0/96",    # IPv4-translated
    "64:ff9b::/96",       # NAT64 well-known prefix
    "64:ff9b:1::/48",     # NAT64 local-use prefix
))

BLOCKED_NAMES = {"localhost", "localhost.localdomain"}
BLOCKED_SUFFIXES = (".localhost", ".local", ".internal", ".home.arpa", ".arpa", ".svc")

# Host then optional port; brackets only around a whole IPv6 literal; port digits only.
_AUTHORITY = re.compile(r"(?:\[(?P<ipv6>[^\[\]]*)\]|(?P<name>[^\[\]:]*))(?::(?P<port>[0-9]+))?")
# A last label that inet_aton or the WHATWG URL parser reads as a number.
_NUMERIC_LABEL = re.compile(r"[0-9]+|0x[0-9a-f]*")
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_DOTTED_QUAD = re.compile(rf"{_OCTET}(?:\.{_OCTET}){{3}}")
# Whitespace and separators, controls (C0, DEL, C1), format (zero-width, BOM, soft hyphen), surrogates.
_FORBIDDEN_CATEGORIES = {"Zs", "Zl", "Zp", "Cc", "Cf", "Cs"}


class UnsafeUrl(Exception):
    """A URL we refuse to send to; `code` is invalid_url, internal_url, unresolvable or
    lookup_timeout (the resolver did not answer in the time it was given)."""

    def __init__(self, code: str, message: str, detail: str | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        # What a refusal at delivery time records (the failure's error_detail): the refused address
        # and the rule for an internal one, the resolver's own words for a name that does not resolve.
        self.detail = detail or message


@dataclass(frozen=True)
class Target:
    """A vetted destination: connect only to `addresses`, send `host` as Host and SNI."""

    url: str
    scheme: str
    host: str
    port: int
    request_target: str
    addresses: tuple[str, ...]


def system_resolver(host: str) -> list[str]:
    """Resolve with socket.getaddrinfo (all families, deduplicated, order kept)."""
    infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    found = (info[4][0] for info in infos if info[0] in (socket.AF_INET, socket.AF_INET6))
    return list(dict.fromkeys(found))


def parse_networks(cidrs: Iterable[str]) -> tuple[Network, ...]:
    """Parse a list of networks (PARTNER_WEBHOOK_ALLOWED_NETWORKS); raise ValueError naming a bad entry."""
    if isinstance(cidrs, str):  # iterating a string would parse it character by character
        raise ValueError(f"must be a JSON list of CIDR strings, not {cidrs!r}")
    networks = []
    for entry in cidrs:
        try:
            if not isinstance(entry, str):  # ip_network() would also accept integers
                raise TypeError
            networks.append(ip_network(entry))  # strict: host bits set is a typo, not intent
        except (TypeError, ValueError):
            raise ValueError(f"invalid network {entry!r} (a CIDR such as 127.0.0.1/32)") from None
    return tuple(networks)


def is_internal_address(ip: Address) -> bool:
    """True unless the address is globally routable, by the explicit tables."""
    return blocking_rule(ip) is not None


def blocking_rule(ip: Address) -> str | None:
    """Which rule of the explicit tables refuses the address ("in 10.0.0.0/8"), or None if it is public."""
    if ip.version == 4:
        return next((f"in {net}" for net in BLOCKED_IPV4 if ip in net), None)
    embedding = next((net for net in IPV4_EMBEDDING_IPV6 if ip in net), None)
    if embedding is not None:
        return f"in {embedding}, which carries an IPv4 address"
    if ip not in GLOBAL_UNICAST_IPV6:
        return f"outside {GLOBAL_UNICAST_IPV6}, the only IPv6 delivered to"
    return next((f"in {net}" for net in BLOCKED_IPV6 if ip in net), None)


def check_url(url: str, resolve: Resolver = system_resolver,
              allowed_networks: Sequence[Network] = ()) -> Target:
    """Validate shape, names and every resolved address; raise UnsafeUrl or return the Target to connect to."""
    _check_characters(url)
    scheme, raw_host, bracketed, port = _split(url)
    host, literal = _classify_host(raw_host, bracketed)
    if literal is not None:  # judged before parser agreement, like names: internal wins over invalid
        _vet([str(literal)], allowed_networks, host)
    request_target = _agreed_request_target(url, scheme, raw_host, bracketed, host, literal, port)
    answers = [str(literal)] if literal is not None else _lookup(resolve, host)
    addresses = _vet(answers, allowed_networks, host)
    return Target(url=url, scheme=scheme, host=host, port=port or SCHEMES[scheme],
                  request_target=request_target, addresses=addresses)


def origin(url: str) -> tuple[str, str, int]:
    """The scheme, host (as a Target's) and port of `url`, without a lookup; UnsafeUrl if malformed."""
    scheme, raw_host, bracketed, port = _split(url)
    return scheme, _classify_host(raw_host, bracketed)[0], port or SCHEMES[scheme]


def _invalid(message: str) -> UnsafeUrl:
    return UnsafeUrl("invalid_url", message)


def _check_characters(url: str) -> None:
    """Refuse over-long URLs and characters that parsers strip, split on or render invisibly."""
    if not isinstance(url, str) or not url:
        raise _invalid("URL must be a non-empty string")
    if len(url) > MAX_URL_LENGTH:
        raise _invalid(f"URL is longer than {MAX_URL_LENGTH} characters")
    for ch in url:
        if ch == "\\" or ch.isspace() or unicodedata.category(ch) in _FORBIDDEN_CATEGORIES:
            raise _invalid(f"URL contains a forbidden character (U+{ord(ch):04X})")


# Parsing a URL is a pure function of its text, and every attempt parses its subscription's URL
# again: the three steps below remember their last answers (not their refusals).
_remember = functools.lru_cache(maxsize=4096)


@_remember
def _split(url: str) -> tuple[str, str, bool, int | None]:
    """Return scheme, raw host, whether it was bracketed, and explicit port, refusing bad shapes."""
    try:
        parts = urlsplit(url)
    except ValueError:
        raise _invalid("URL cannot be parsed") from None
    if parts.scheme not in SCHEMES:
        raise _invalid("URL scheme must be http or https")
    if not url[len(parts.scheme) + 1:].startswith("//") or not parts.netloc:
        raise _invalid("URL must have a host")
    # The authority as the most lenient parser reads it (up to the first "/"): an "@" anywhere in
    # there is user-info to someone, e.g. "http://a.example#@127.0.0.1/".
    if "@" in url[len(parts.scheme) + 3:].split("/", 1)[0]:
        raise _invalid("URL must not contain user-info")
    if "%" in parts.netloc:  # percent-encoded hosts and IPv6 zone ids
        raise _invalid("URL host must not be percent-encoded or scoped")
    match = _AUTHORITY.fullmatch(parts.netloc)
    if match is None:
        raise _invalid("URL host or port is malformed")
    bracketed = match["ipv6"] is not None
    raw_host = match["ipv6"] if bracketed else match["name"]
    if not raw_host:
        raise _invalid("URL must have a host")
    port = int(match["port"]) if match["port"] is not None else None
    if port is not None and port not in SCHEMES.values() and not 1024 <= port <= 65535:
        raise _invalid("URL port must be 80, 443 or 1024-65535")
    return parts.scheme, raw_host, bracketed, port


@_remember
def _classify_host(raw_host: str, bracketed: bool) -> tuple[str, Address | None]:
    """Return the ASCII host and its IP if it is a literal; refuse odd spellings and internal names."""
    if bracketed:
        try:
            ip = IPv6Address(raw_host)  # refuses bracketed IPv4 too
        except ValueError:
            raise _invalid("URL host in brackets must be an IPv6 address") from None
        return str(ip), ip
    try:
        # UTS-46 maps full-width letters and dots, so names are judged as DNS will see them.
        ascii_host = idna.encode(raw_host, uts46=True).decode("ascii")
    except (idna.IDNAError, UnicodeError):
        raise _invalid("URL host is not a valid domain name") from None
    name = ascii_host.removesuffix(".")
    if _NUMERIC_LABEL.fullmatch(name.rsplit(".", 1)[-1]):
        # Resolvers read 0177.1, 0x7f.1 and 2130706433 as IPs; only one spelling is unambiguous.
        if not _DOTTED_QUAD.fullmatch(ascii_host):
            raise _invalid("URL host looks like an IP address but is not a dotted quad")
        return ascii_host, IPv4Address(ascii_host)
    if "." not in name or name in BLOCKED_NAMES or name.endswith(BLOCKED_SUFFIXES):
        raise UnsafeUrl("internal_url", f"URL host {name!r} is an internal name")
    return name, None


@_remember
def _agreed_request_target(url: str, scheme: str, raw_host: str, bracketed: bool, host: str,
                           literal: Address | None, port: int | None) -> str:
    """Refuse the URL unless urlsplit and urllib3 (the parser that connects) read it alike."""
    try:
        theirs = urlsplit(url)
        if (theirs.hostname, theirs.port, theirs.username) != (raw_host.lower(), port, None):
            raise ValueError
        ours = parse_url(url)
    except (ValueError, LocationParseError):
        raise _invalid("URL is read differently by different parsers") from None
    their_host = (ours.host or "").lower()
    if bracketed:
        same_host = their_host.startswith("[") and _ip_or_none(their_host[1:-1]) == literal
    else:
        same_host = their_host.removesuffix(".") == host
    if not same_host or (ours.scheme, ours.port, ours.auth) != (scheme, port, None):
        raise _invalid("URL is read differently by different parsers")
    return ours.request_uri


def _lookup(resolve: Resolver, host: str) -> Sequence[str]:
    """Ask the resolver once; a failure to answer is unresolvable, no answer in time lookup_timeout.
    Anything else the resolver raises (dns.LookupsBusy: no lookup could start) is no verdict on the
    URL and reaches the caller as it is."""
    try:
        return resolve(host) or ()
    except TimeoutError:
        raise UnsafeUrl("lookup_timeout", f"URL host {host!r} did not resolve in time") from None
    except (OSError, UnicodeError) as error:  # getaddrinfo raises UnicodeError for some bad names
        said = getattr(error, "strerror", None) or type(error).__name__
        raise UnsafeUrl("unresolvable", f"URL host {host!r} does not resolve",
                        f"lookup of {host} failed: {said}") from None


def _ip_or_none(text: object) -> Address | None:
    try:
        return ip_address(text) if isinstance(text, str) else None
    except ValueError:
        return None


def _is_allowed(ip: Address, allowed_networks: Sequence[Network]) -> bool:
    """True if the operator exempted the address; a mapped IPv6 counts as its IPv4."""
    candidates = [ip]
    if isinstance(ip, IPv6Address) and ip.ipv4_mapped is not None:
        candidates.append(ip.ipv4_mapped)
    return any(c in net for c in candidates for net in allowed_networks)


def _vet(answers: Sequence[str], allowed_networks: Sequence[Network], host: str) -> tuple[str, ...]:
    """Return the answers as IP strings if every one is a public (or allowed) IP address."""
    ips = [_ip_or_none(answer) for answer in answers]
    valid = [ip for ip in ips if ip is not None]
    for ip in valid:
        rule = blocking_rule(ip)
        if rule is not None and not _is_allowed(ip, allowed_networks):
            named = "" if str(ip) == host else f" ({host})"
            raise UnsafeUrl("internal_url", f"URL host {host!r} is an internal address",
                            f"{ip}{named} is {rule}: an internal address, never delivered to")
    if not valid or len(valid) != len(ips):
        raise UnsafeUrl("unresolvable", f"URL host {host!r} does not resolve to IP addresses",
                        f"lookup of {host} returned no usable IP address")
    return tuple(dict.fromkeys(str(ip) for ip in valid))
