"""Which network addresses the forwarder must not connect to (unless private destinations are
allowed): a destination URL must not reach into our own network. Pure: the egress guard
(``gateway.outbound.egress``) applies these rules to each address a name resolves to.
"""

from __future__ import annotations

import ipaddress

# IPv6 prefixes that carry an IPv4 address a packet may end up at (the guard judges that one):
# NAT64's well-known prefix (RFC 6052: the last 32 bits), 6to4 (RFC 3056: bits 16-47), Teredo
# (RFC 4380: server and client), SIIT's IPv4-translated ::ffff:0:0:0/96 (RFC 2765), and the
# deprecated IPv4-compatible ::/96 (RFC 4291); IPv4-mapped ::ffff:0:0/96 too.
NAT64_WELL_KNOWN = ipaddress.IPv6Network("64:ff9b::/96")
# RFC 8215's local-use NAT64 prefix: where the IPv4 address sits depends on the operator's
# prefix length, and the prefix is never global, so every address in it is refused.
NAT64_LOCAL_USE = ipaddress.IPv6Network("64:ff9b:1::/48")
SIIT_TRANSLATED = ipaddress.IPv6Network("::ffff:0:0:0/96")
IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")


def embedded_ipv4(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address carries (and a NAT64, 6to4 or Teredo relay, or the
    host's own stack, would deliver to); empty for a plain IPv6 address."""
    if ip.ipv4_mapped is not None:
        return [ip.ipv4_mapped]
    low32 = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip in NAT64_WELL_KNOWN or ip in SIIT_TRANSLATED:
        return [low32]
    if ip.sixtofour is not None:
        return [ip.sixtofour]
    if ip.teredo is not None:
        return list(ip.teredo)
    if ip in IPV4_COMPATIBLE and int(ip) > 1:  # not :: nor ::1
        return [low32]
    return []


def address_refused(address: str) -> str | None:
    """Why the forwarder must not connect to ``address`` unless private destinations are
    allowed (None: a global unicast address, fine). Loopback, link-local (cloud metadata
    endpoints live at 169.254.169.254), private, shared, reserved and multicast ranges, also
    when carried inside an IPv6 address (IPv4-mapped, NAT64, 6to4, Teredo: ``embedded_ipv4``):
    a destination URL must not reach into our own network."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])  # an IPv6 zone id names no range
    except ValueError:
        return "not an IP address"
    if isinstance(ip, ipaddress.IPv6Address):
        if ip in NAT64_LOCAL_USE:
            return f"{address} is a local-use NAT64 address (RFC 8215)"
        for inner in embedded_ipv4(ip):
            why = _range_refused(inner)
            if why is not None:
                return f"{address} carries {inner}, a {why} address"
    why = _range_refused(ip)
    return None if why is None else f"{address} is a {why} address"


def _range_refused(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    for why, hit in (
        ("loopback", ip.is_loopback),
        ("link-local", ip.is_link_local),
        ("multicast", ip.is_multicast),
        ("unspecified", ip.is_unspecified),
        ("private", not ip.is_global),
    ):
        if hit:
            return why
    return None


def host_refused(host: str) -> str | None:
    """Why a URL's host is refused before any lookup (an IP literal outside the global
    ranges, or a localhost name), or None: a name is judged by what it resolves to."""
    host = host.strip("[]").rstrip(".").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return f"{host} is a loopback name"
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return None
    return address_refused(host)
