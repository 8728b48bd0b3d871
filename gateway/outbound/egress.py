"""Where the forwarder may connect: a DNS resolver that refuses names resolving to loopback,
private or link-local addresses (unless ``GATEWAY_FORWARD_ALLOW_PRIVATE``).

The check is made on the very addresses the connection then uses (aiohttp connects to what
the resolver returns), so a name that resolved to a public address when the destination was
added and to 127.0.0.1 now (DNS rebinding) is refused at connect time. IP literals never reach
a resolver: ``gateway.core.forwarding.host_refused`` judges those before the request.
"""

from __future__ import annotations

import errno
import socket
from urllib.parse import urlsplit

from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver

from gateway.core.forwarding import address_refused, host_refused


class RefusedAddress(OSError):
    """A destination's name resolved to an address the forwarder must not connect to."""


def refused_among(host: str, found: list[ResolveResult]) -> str | None:
    """Why ``host`` is refused, judged by every address it resolved to (all or nothing: a name
    that also resolves inside is not used at all), or None."""
    for r in found:
        why = address_refused(r["host"])
        if why is not None:
            return f"{host} resolves to {why}"
    return None


class GuardedResolver(AbstractResolver):
    def __init__(self, inner: AbstractResolver | None = None) -> None:
        self.inner = inner or DefaultResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        found = await self.inner.resolve(host, port, family)
        why = refused_among(host, found)
        if why is not None:
            # aiohttp's error shows the strerror
            raise RefusedAddress(errno.EACCES, f"{why} (GATEWAY_FORWARD_ALLOW_PRIVATE)")
        return found

    async def close(self) -> None:
        await self.inner.close()


async def url_refused(url: str, resolver: AbstractResolver) -> str | None:
    """Why a destination URL reaches into a private network now: its host is such an address or
    a localhost name, or its name resolves (over IPv4 and IPv6) to such an address; None if not.
    A name that does not resolve now raises OSError: the caller decides (the connect-time
    check covers it later)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    why = host_refused(host)
    if why is not None:
        return why
    return refused_among(host, await resolver.resolve(host, parts.port or 443, socket.AF_UNSPEC))
