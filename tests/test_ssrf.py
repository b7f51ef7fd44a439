"""ssrf.check_url: cases from docs/security.md, the IANA special-purpose registries and SSRF bypass write-ups.

No test touches the network: every name goes through a stub resolver.
"""

import re
import socket
from ipaddress import ip_address, ip_network

import pytest

from partner.outbound.ssrf import Target, UnsafeUrl, check_url, is_internal_address, parse_networks, system_resolver

from tests.support import PUBLIC_IP, StubResolver
LOOPBACK = parse_networks(["127.0.0.0/8"])


def refusal(url, resolver=None, allowed=()):
    with pytest.raises(UnsafeUrl) as caught:
        check_url(url, resolver or StubResolver(default=[PUBLIC_IP]), allowed)
    return caught.value


# --- URL shape: invalid_url, and the resolver is never asked -------------------------------------

INVALID_SHAPE = [
    # schemes
    "file:///etc/passwd",
    "gopher://127.0.0.1:6379/_INFO",
    "ftp://example.com/",
    "dict://example.com:11211/stat",
    "ws://example.com/",
    "javascript:alert(1)",
    "data:text/plain,hi",
    "//example.com/hook",
    "example.com/hook",
    "http:example.com",
    "http:/example.com",
    "http:///example.com",
    "http://",
    "http:///",
    "http://:8080/",
    "http://?x=1",
    "",
    # ports
    "http://example.com:0/",
    "http://example.com:1/",
    "http://example.com:8/",
    "http://example.com:22/",
    "http://example.com:25/",
    "http://example.com:1023/",
    "http://example.com:65536/",
    "http://example.com:99999/",
    "http://example.com:/",
    "http://[2606:4700::1111]:/",
    "http://example.com:+80/",
    "http://example.com:-1/",
    "http://example.com:0x50/",
    "http://example.com:80:80/",
    "http://example.com:８０/",
    # user-info, and parser confusions from "A New Era of SSRF"
    "http://user@example.com/",
    "http://user:pass@example.com/",
    "http://@example.com/",
    "http://:@example.com/",
    "http://a@b@example.com/",
    "http://example.com@127.0.0.1/",
    "http://127.0.0.1@example.com/",
    "http://evil.com;@127.0.0.1/",
    "http://evil.com#@127.0.0.1/",
    "http://evil.com?@127.0.0.1/",
    "http://[::1]:80@evil.com/",
    "http://example.com:80@127.0.0.1:8080/",
    "http://foo@127.0.0.1:11211@example.com:8080/",
    "http://[::1]x/",
    "http://[::1/",
    "http://example.com]/",
    "http://[v1.fe80::1]/",
    # backslash, whitespace, control and format characters anywhere
    "http://127.0.0.1\\@example.com/",
    "http:\\\\example.com/",
    "http://example.com\\hook",
    "http://example.com/a\\b",
    "http://example.com/a b",
    "http://exa mple.com/",
    " http://example.com/",
    "http://example.com/\t",
    "http://exa\tmple.com/",
    "http://example.com/\n",
    "http://example.com/a\r\nHost: 127.0.0.1",
    "http://example.com/\x00",
    "http://example.com/\x7f",
    "http://example.com/\x85",
    "http://example.com/\xa0",
    "http://example.com/\u2028",
    "http://example.com/\u3000",
    "http://exa\u200bmple.com/",
    "http://example.com\ufeff/",
    "http://local\u00adhost/",
    "http://example.com/\u200e",
    "http://example.com/\u202e",
    "http://exa\u2060mple.com/",
    # percent-encoded and scoped hosts
    "http://%31%32%37.0.0.1/",
    "http://127.0.0.%31/",
    "http://ex%61mple.com/",
    "http://%6c%6f%63%61%6c%68%6f%73%74/",
    "http://[fe80::1%25eth0]/",
    "http://[fe80::1%eth0]/",
    # not valid domain names
    "http://exa..mple.com/",
    "http://-example.com/",
    "http://xn--zz.com/",
    "http://under_score.example.com/",
    "http://a\u2488.com/",
    "http://" + "a" * 64 + ".com/",
    # public names the connecting parser (urllib3, no UTS-46) cannot read
    "http://ｅｘａｍｐｌｅ.com/",
    "http://8。8。8。8/",
]


@pytest.mark.parametrize("url", INVALID_SHAPE)
def test_malformed_url_is_invalid(url):
    resolver = StubResolver(default=[PUBLIC_IP])
    assert refusal(url, resolver).code == "invalid_url"
    assert resolver.lookups == []


# --- IP spellings other than a canonical dotted quad: invalid_url --------------------------------

ODD_IP_SPELLINGS = [
    "http://2130706433/",            # decimal 127.0.0.1
    "http://017700000001/",          # octal 127.0.0.1
    "http://0177.0.0.1/",
    "http://0177.1/",
    "http://0x7f.0.0.1/",
    "http://0x7f.1/",
    "http://0x7f000001/",
    "http://0X7F000001/",
    "http://127.1/",
    "http://127.0.1/",
    "http://127.000.000.001/",
    "http://127.0.0.01/",
    "http://127.0.0.1./",            # trailing dot: a resolver may treat it as a name
    "http://8.8.8.8./",
    "http://08.08.08.08/",
    "http://0x08.0x08.0x08.0x08/",
    "http://0/",
    "http://0.0/",
    "http://00000/",
    "http://0x/",
    "http://3232235521/",            # 192.168.0.1
    "http://2852039166/",            # 169.254.169.254
    "http://0xa9fea9fe/",
    "http://0251.0376.0251.0376/",
    "http://0xa9.0xfe.0xa9.0xfe/",
    "http://2829091088/",            # 168.63.129.16
    "http://0xa8.0x3f.0x81.0x10/",
    "http://425.510.425.510/",       # octets > 255 wrap in some parsers
    "http://256.0.0.1/",
    "http://1.2.3.4.5/",
    "http://example.123/",
    "http://a.b.0x1/",
    "http://[127.0.0.1]/",           # bracketed IPv4
    "http://[8.8.8.8]/",
    "http://[0x7f.1]/",
]


@pytest.mark.parametrize("url", ODD_IP_SPELLINGS)
def test_non_canonical_ip_spelling_is_invalid(url):
    resolver = StubResolver(default=[PUBLIC_IP])
    assert refusal(url, resolver).code == "invalid_url"
    assert resolver.lookups == []


# --- Internal names: internal_url, before any lookup ----------------------------------------------

INTERNAL_NAMES = [
    "http://localhost/",
    "http://localhost:8080/",
    "http://LOCALHOST/",
    "http://LocalHost.:8080/",
    "http://localhost./",
    "http://foo.localhost/",
    "http://a.b.LOCALHOST/",
    "http://localhost.localdomain/",
    "http://localhost.localdomain./",
    "http://printer.local/",
    "http://printer.LOCAL./",
    "http://example.com.local/",
    "http://metadata.google.internal/computeMetadata/v1/",
    "http://db.internal:5432/",
    "http://router.home.arpa/",
    "http://1.0.0.127.in-addr.arpa/",
    "http://kubernetes.default.svc/",
    "http://jenkins:8080/",
    "http://metadata/",
    "http://intranet./",
    # UTS-46 look-alikes that map to the names above
    "http://ｌｏｃａｌｈｏｓｔ/",
    "http://ＬＯＣＡＬＨＯＳＴ:8080/",
    "http://localhost｡/",
    "http://localhost。/",
    "http://localhost．/",
    "http://ⓛⓞⓒⓐⓛⓗⓞⓢⓣ/",
    "http://metadata．google．internal/",
    "http://printer｡local/",
]


@pytest.mark.parametrize("url", INTERNAL_NAMES)
def test_internal_name_is_refused_without_lookup(url):
    resolver = StubResolver(default=[PUBLIC_IP])
    assert refusal(url, resolver).code == "internal_url"
    assert resolver.lookups == []


# --- IP literals: internal ranges refused, public ones pass, resolver never asked ------------------

INTERNAL_LITERALS = [
    # IANA IPv4 special-purpose registry, first and last of each block
    "0.0.0.0", "0.255.255.255",
    "10.0.0.0", "10.255.255.255",
    "100.64.0.0", "100.100.100.200", "100.127.255.255",
    "127.0.0.1", "127.0.0.0", "127.255.255.255",
    "169.254.0.0", "169.254.169.254", "169.254.255.255",
    "172.16.0.0", "172.31.255.255",
    "192.0.0.0", "192.0.0.9", "192.0.0.255",
    "192.0.2.0", "192.0.2.255",
    "192.88.99.0", "192.88.99.255",
    "192.168.0.0", "192.168.1.1", "192.168.255.255",
    "198.18.0.0", "198.19.255.255",
    "198.51.100.0", "198.51.100.255",
    "203.0.113.0", "203.0.113.255",
    "224.0.0.0", "239.255.255.250",
    "240.0.0.0", "255.255.255.255",
    "168.63.129.16", "[::ffff:168.63.129.16]", "[64:ff9b::a83f:8110]",  # Azure WireServer
    # IANA IPv6 special-purpose registry and everything outside 2000::/3
    "[::1]", "[::]", "[0:0:0:0:0:0:0:1]",
    "[::ffff:127.0.0.1]", "[::ffff:7f00:1]", "[0:0:0:0:0:ffff:127.0.0.1]", "[::FFFF:A9FE:A9FE]",
    "[::ffff:8.8.8.8]",               # mapped public: still outside 2000::/3
    "[::127.0.0.1]", "[::7f00:1]",    # IPv4-compatible
    "[::ffff:0:7f00:1]", "[::ffff:0:808:808]",  # IPv4-translated
    "[64:ff9b::7f00:1]", "[64:ff9b::127.0.0.1]", "[64:ff9b::808:808]",  # NAT64
    "[64:ff9b:1::1]",
    "[100::1]", "[100:0:0:1::1]",
    "[2001::1]", "[2001:0:4136:e378:8000:63bf:3fff:fdd2]",  # Teredo
    "[2001:1::1]", "[2001:2::1]", "[2001:3::1]", "[2001:4:112::1]",
    "[2001:10::1]", "[2001:20::1]", "[2001:30::1]",
    "[2001:1ff:ffff:ffff:ffff:ffff:ffff:ffff]",
    "[2001:db8::1]", "[2001:db8:ffff:ffff:ffff:ffff:ffff:ffff]",
    "[2002::1]", "[2002:7f00:1::]", "[2002:a9fe:a9fe::]", "[2002:808:808::1]",  # 6to4
    "[3fff::1]", "[3fff:fff:ffff:ffff:ffff:ffff:ffff:ffff]",
    "[1fff:ffff:ffff:ffff:ffff:ffff:ffff:ffff]", "[4000::1]", "[5f00::1]",
    "[fc00::1]", "[fd00:ec2::254]", "[fe80::1]", "[febf::1]", "[fec0::1]",
    "[ff02::1]", "[ff05::1:3]",
]


@pytest.mark.parametrize("host", INTERNAL_LITERALS)
def test_internal_ip_literal_is_refused_without_lookup(host):
    resolver = StubResolver(default=[PUBLIC_IP])
    assert refusal(f"http://{host}:8080/", resolver).code == "internal_url"
    assert resolver.lookups == []


PUBLIC_LITERALS = [
    # (host in URL, Target.host)
    ("8.8.8.8", "8.8.8.8"),
    ("1.1.1.1", "1.1.1.1"),
    (PUBLIC_IP, PUBLIC_IP),
    ("1.0.0.0", "1.0.0.0"),
    ("9.255.255.255", "9.255.255.255"),
    ("11.0.0.0", "11.0.0.0"),
    ("100.63.255.255", "100.63.255.255"),
    ("100.128.0.0", "100.128.0.0"),
    ("126.255.255.255", "126.255.255.255"),
    ("128.0.0.0", "128.0.0.0"),
    ("169.253.255.255", "169.253.255.255"),
    ("169.255.0.0", "169.255.0.0"),
    ("172.15.255.255", "172.15.255.255"),
    ("172.32.0.0", "172.32.0.0"),
    ("192.0.1.0", "192.0.1.0"),
    ("168.63.129.15", "168.63.129.15"),   # Azure WireServer's neighbours
    ("168.63.129.17", "168.63.129.17"),
    ("192.0.3.0", "192.0.3.0"),
    ("192.31.196.1", "192.31.196.1"),     # AS112-v4: globally reachable
    ("192.52.193.1", "192.52.193.1"),     # AMT: globally reachable
    ("192.88.98.255", "192.88.98.255"),
    ("192.88.100.0", "192.88.100.0"),
    ("192.167.255.255", "192.167.255.255"),
    ("192.169.0.0", "192.169.0.0"),
    ("192.175.48.1", "192.175.48.1"),     # AS112 direct delegation
    ("198.17.255.255", "198.17.255.255"),
    ("198.20.0.0", "198.20.0.0"),
    ("198.51.99.255", "198.51.99.255"),
    ("198.51.101.0", "198.51.101.0"),
    ("203.0.112.255", "203.0.112.255"),
    ("203.0.114.0", "203.0.114.0"),
    ("223.255.255.255", "223.255.255.255"),
    ("[2606:4700::1111]", "2606:4700::1111"),
    ("[2606:4700:4700:0:0:0:0:1111]", "2606:4700:4700::1111"),
    ("[2a00:1450:4001::1]", "2a00:1450:4001::1"),
    ("[2001:4860:4860::8888]", "2001:4860:4860::8888"),
    ("[2001:200::1]", "2001:200::1"),
    ("[2001:db9::1]", "2001:db9::1"),
    ("[2003::1]", "2003::1"),
    ("[2620:4f:8000::1]", "2620:4f:8000::1"),  # AS112-v6: globally reachable
    ("[3fff:1000::1]", "3fff:1000::1"),
    ("[3FFF:FFFF::1]", "3fff:ffff::1"),
]


@pytest.mark.parametrize("host, canonical", PUBLIC_LITERALS)
def test_public_ip_literal_passes_without_lookup(host, canonical):
    resolver = StubResolver(default=[PUBLIC_IP])
    target = check_url(f"https://{host}/hook", resolver)
    assert (target.host, target.port, target.addresses) == (canonical, 443, (canonical,))
    assert resolver.lookups == []


# --- IDNA-mapped IP literals are judged as the IP they map to ------------------------------------

@pytest.mark.parametrize("url", [
    "http://127。0。0。1/",
    "http://127．0．0．1/",
    "http://127｡0｡0｡1/",
    "http://１２７.0.0.1/",
    "http://①②⑦.⓪.⓪.①/",
    "http://①⑨②.①⑥⑧.0.1/",
])
def test_idna_mapped_internal_ip_is_refused(url):
    assert refusal(url).code == "internal_url"


# --- Accepted URLs: scheme, port, request target -------------------------------------------------

ACCEPTED = [
    # (url, scheme, host, port, request_target)
    ("http://example.com", "http", "example.com", 80, "/"),
    ("https://example.com", "https", "example.com", 443, "/"),
    ("HTTP://EXAMPLE.COM/Hook", "http", "example.com", 80, "/Hook"),
    ("HtTpS://Example.Com./", "https", "example.com", 443, "/"),
    ("http://example.com:80/", "http", "example.com", 80, "/"),
    ("https://example.com:443/", "https", "example.com", 443, "/"),
    ("http://example.com:443/", "http", "example.com", 443, "/"),
    ("https://example.com:80/", "https", "example.com", 80, "/"),
    ("http://example.com:1024/", "http", "example.com", 1024, "/"),
    ("http://example.com:8080/", "http", "example.com", 8080, "/"),
    ("http://example.com:65535/", "http", "example.com", 65535, "/"),
    ("http://example.com:0080/", "http", "example.com", 80, "/"),
    ("https://example.com/p/q?x=1&y=2#frag", "https", "example.com", 443, "/p/q?x=1&y=2"),
    ("https://example.com?x=1", "https", "example.com", 443, "/?x=1"),
    ("https://example.com#frag", "https", "example.com", 443, "/"),
    ("https://example.com/a%0ab", "https", "example.com", 443, "/a%0Ab"),
    ("https://example.com/%2e%2e/", "https", "example.com", 443, "/%2E%2E/"),
    ("https://example.com/a@b?to=x@y", "https", "example.com", 443, "/a@b?to=x@y"),
    ("https://example.com/#@127.0.0.1", "https", "example.com", 443, "/"),
    ("https://hooks.partner.example.com/v1/in", "https", "hooks.partner.example.com", 443, "/v1/in"),
    ("https://localhost.example.com/", "https", "localhost.example.com", 443, "/"),
    ("https://notlocalhost.com/", "https", "notlocalhost.com", 443, "/"),
    ("https://example.internal.com/", "https", "example.internal.com", 443, "/"),
    ("https://127.0.0.1.example.com/", "https", "127.0.0.1.example.com", 443, "/"),
    ("https://1.2.3.4.nip.io.example/", "https", "1.2.3.4.nip.io.example", 443, "/"),
    ("https://例え.jp/", "https", "xn--r8jz45g.jp", 443, "/"),
    ("https://Bücher.example/", "https", "xn--bcher-kva.example", 443, "/"),
    ("https://xn--bcher-kva.example/", "https", "xn--bcher-kva.example", 443, "/"),
    ("https://example.com/ä", "https", "example.com", 443, "/%C3%A4"),
    ("https://example.com/" + "a" * 2028, "https", "example.com", 443, "/" + "a" * 2028),
]


@pytest.mark.parametrize("url, scheme, host, port, request_target", ACCEPTED)
def test_accepted_url(url, scheme, host, port, request_target):
    resolver = StubResolver(default=[PUBLIC_IP])
    target = check_url(url, resolver)
    assert target == Target(url, scheme, host, port, request_target, (PUBLIC_IP,))
    assert resolver.lookups == [host]


def test_url_of_exactly_2048_characters_passes_and_2049_does_not():
    url = "https://example.com/" + "a" * 2028
    assert len(url) == 2048
    assert check_url(url, StubResolver(default=[PUBLIC_IP])).port == 443
    assert refusal(url + "a").code == "invalid_url"


# --- Names that resolve: every answer is vetted ---------------------------------------------------

DNS = {
    "private.example": ["10.0.0.1"],
    "loopback.example": ["127.0.0.1"],
    "metadata.example": ["169.254.169.254"],
    "wireserver.example": ["168.63.129.16"],
    "mixed.example": [PUBLIC_IP, "192.168.0.1"],
    "mixed6.example": ["2606:4700::1111", "fe80::1"],
    "mapped.example": ["::ffff:10.0.0.1"],
    "nat64.example": ["64:ff9b::a9fe:a9fe"],
    "sixtofour.example": ["2002:7f00:1::1"],
    "twopublic.example": ["1.1.1.1", "2606:4700::1111"],
    "duplicate.example": ["1.1.1.1", "1.1.1.1", "8.8.8.8"],
    "empty.example": [],
    "broken.example": OSError("Name or service not known"),
    "garbage.example": ["not-an-ip"],
    "halfgarbage.example": ["1.1.1.1", "not-an-ip"],
    "short.example": ["127.1"],
    "integer.example": [2130706433],
    "receiver.example": ["127.0.0.1"],
    "receiver6.example": ["::ffff:127.0.0.1"],
}

RESOLVED = [
    ("http://private.example/", "internal_url"),
    ("http://loopback.example/", "internal_url"),
    ("http://metadata.example/", "internal_url"),
    ("http://wireserver.example/", "internal_url"),
    ("http://mixed.example/", "internal_url"),
    ("http://mixed6.example/", "internal_url"),
    ("http://mapped.example/", "internal_url"),
    ("http://nat64.example/", "internal_url"),
    ("http://sixtofour.example/", "internal_url"),
    ("http://empty.example/", "unresolvable"),
    ("http://broken.example/", "unresolvable"),
    ("http://garbage.example/", "unresolvable"),
    ("http://halfgarbage.example/", "unresolvable"),
    ("http://short.example/", "unresolvable"),
    ("http://integer.example/", "unresolvable"),
]


@pytest.mark.parametrize("url, code", RESOLVED)
def test_resolved_name_is_refused(url, code):
    resolver = StubResolver(DNS, default=[PUBLIC_IP])
    assert refusal(url, resolver).code == code
    assert len(resolver.lookups) == 1


def test_name_with_two_public_answers_keeps_both():
    target = check_url("https://twopublic.example/", StubResolver(DNS, default=[PUBLIC_IP]))
    assert target.addresses == ("1.1.1.1", "2606:4700::1111")


def test_duplicate_answers_are_dropped_in_order():
    assert check_url("https://duplicate.example/", StubResolver(DNS, default=[PUBLIC_IP])).addresses == ("1.1.1.1", "8.8.8.8")


def test_resolver_gets_lower_case_a_label_without_trailing_dot():
    resolver = StubResolver(default=[PUBLIC_IP])
    check_url("https://Bücher.Example.:8443/", resolver)
    assert resolver.lookups == ["xn--bcher-kva.example"]


# --- PARTNER_WEBHOOK_ALLOWED_NETWORKS -------------------------------------------------------------

def test_allowed_network_exempts_an_ip_literal():
    target = check_url("http://127.0.0.1:8080/x", StubResolver(default=[PUBLIC_IP]), LOOPBACK)
    assert (target.host, target.port, target.request_target, target.addresses) == \
        ("127.0.0.1", 8080, "/x", ("127.0.0.1",))


def test_allowed_network_exempts_a_resolved_name():
    target = check_url("http://receiver.example:8080/", StubResolver(DNS, default=[PUBLIC_IP]), LOOPBACK)
    assert (target.host, target.addresses) == ("receiver.example", ("127.0.0.1",))


def test_allowed_network_judges_mapped_ipv6_by_its_ipv4():
    assert check_url("http://receiver6.example/", StubResolver(DNS, default=[PUBLIC_IP]), LOOPBACK).addresses == \
        ("::ffff:7f00:1",)
    assert check_url("http://[::ffff:127.0.0.1]:8080/", StubResolver(default=[PUBLIC_IP]), LOOPBACK).host == "::ffff:7f00:1"


def test_allowed_ipv6_network_exempts_ipv6_loopback():
    assert check_url("http://[::1]:8080/", StubResolver(default=[PUBLIC_IP]), parse_networks(["::1/128"])).host == "::1"


@pytest.mark.parametrize("url, code", [
    ("http://localhost:8080/", "internal_url"),
    ("http://ｌｏｃａｌｈｏｓｔ:8080/", "internal_url"),
    ("http://foo.localhost:8080/", "internal_url"),
    ("http://10.0.0.1:8080/", "internal_url"),
    ("http://[::1]:8080/", "internal_url"),
    ("http://[64:ff9b::7f00:1]:8080/", "internal_url"),
    ("http://127.0.0.1:22/", "invalid_url"),
    ("http://127.1:8080/", "invalid_url"),
    ("http://0x7f000001:8080/", "invalid_url"),
    ("http://user@127.0.0.1:8080/", "invalid_url"),
])
def test_allowed_network_does_not_exempt_names_or_shape(url, code):
    assert refusal(url, allowed=LOOPBACK).code == code


# --- Error messages -------------------------------------------------------------------------------

def test_message_names_control_character_without_echoing_it():
    error = refusal("http://example.com/\r\nX-Injected: 1")
    assert error.message == "URL contains a forbidden character (U+000D)"
    assert "\r" not in str(error)


# --- is_internal_address --------------------------------------------------------------------------

@pytest.mark.parametrize("ip, internal", [
    ("0.0.0.0", True), ("10.1.2.3", True), ("100.64.0.1", True), ("127.0.0.1", True),
    ("169.254.169.254", True), ("172.20.0.1", True), ("192.0.0.170", True), ("192.0.2.1", True),
    ("192.88.99.1", True), ("192.168.0.1", True), ("198.18.0.1", True), ("198.51.100.1", True),
    ("203.0.113.1", True), ("224.0.0.1", True), ("255.255.255.255", True), ("168.63.129.16", True),
    ("8.8.8.8", False), ("100.128.0.0", False), ("172.32.0.0", False), ("198.20.0.0", False),
    ("::1", True), ("::", True), ("::ffff:127.0.0.1", True), ("::ffff:8.8.8.8", True),
    ("::ffff:0:7f00:1", True), ("::7f00:1", True), ("64:ff9b::7f00:1", True), ("64:ff9b::808:808", True),
    ("64:ff9b:1::a00:1", True), ("2001::1", True), ("2001:db8::1", True), ("2002:7f00:1::", True),
    ("3fff::1", True), ("fc00::1", True), ("fe80::1", True), ("ff02::1", True), ("100::1", True),
    ("2606:4700::1111", False), ("2a00:1450:4001::1", False), ("2001:200::1", False),
])
def test_is_internal_address(ip, internal):
    assert is_internal_address(ip_address(ip)) is internal


# --- the refusal's detail: the address and the rule, for the failure record --------------------

@pytest.mark.parametrize("answers, detail", [
    (["10.1.2.3"], "10.1.2.3 (hooks.example.com) is in 10.0.0.0/8: an internal address, never delivered to"),
    ([PUBLIC_IP, "169.254.169.254"],
     "169.254.169.254 (hooks.example.com) is in 169.254.0.0/16: an internal address, never delivered to"),
    (["::ffff:127.0.0.1"], "::ffff:7f00:1 (hooks.example.com) is in ::ffff:0:0/96, which carries an IPv4 "
                           "address: an internal address, never delivered to"),
    (["fe80::1"], "fe80::1 (hooks.example.com) is outside 2000::/3, the only IPv6 delivered to: an internal "
                  "address, never delivered to"),
    (["2001:db8::1"], "2001:db8::1 (hooks.example.com) is in 2001:db8::/32: an internal address, never delivered to"),
])
def test_an_internal_answer_is_refused_naming_the_address_and_the_network(answers, detail):
    error = refusal("https://hooks.example.com/h", StubResolver({"hooks.example.com": answers}))
    assert (error.code, error.message) == ("internal_url", "URL host 'hooks.example.com' is an internal address")
    assert error.detail == detail


def test_an_internal_literal_is_refused_naming_the_network():
    assert refusal("http://192.168.1.1/h").detail == \
        "192.168.1.1 is in 192.168.0.0/16: an internal address, never delivered to"


def test_a_name_that_does_not_resolve_keeps_the_resolvers_words():
    resolver = StubResolver({"gone.example.com": socket.gaierror(socket.EAI_NONAME, "Name or service not known")})
    error = refusal("https://gone.example.com/h", resolver)
    assert (error.code, error.detail) == ("unresolvable", "lookup of gone.example.com failed: Name or service not known")


# --- parse_networks -------------------------------------------------------------------------------

def test_parse_networks_accepts_cidrs_and_single_addresses():
    assert parse_networks(["127.0.0.0/8", "::1/128", "10.1.2.3"]) == (
        ip_network("127.0.0.0/8"), ip_network("::1/128"), ip_network("10.1.2.3/32"))


def test_parse_networks_accepts_empty_list():
    assert parse_networks([]) == ()


@pytest.mark.parametrize("entry", ["127.0.0.1/8", "not-a-net", "", "127.0.0.0/33", " 127.0.0.0/8",
                                   "0177.0.0.0/8", "fe80::/129", 2130706433, None])
def test_parse_networks_names_the_bad_entry(entry):
    with pytest.raises(ValueError, match=re.escape(repr(entry))):
        parse_networks(["10.0.0.0/8", entry])


def test_parse_networks_refuses_a_bare_string():
    with pytest.raises(ValueError):
        parse_networks("127.0.0.0/8")


# --- system_resolver (numeric host only: no DNS traffic) -------------------------------------------

def test_system_resolver_returns_ip_strings_for_a_numeric_host():
    assert system_resolver("127.0.0.1") == ["127.0.0.1"]
