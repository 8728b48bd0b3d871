"""Where the forwarder may connect: a DNS resolver that refuses names resolving to loopback,
private or link-local addresses (unless ``GATEWAY_FORWARD_ALLOW_PRIVATE``).

The check is made on the very addresses the connection then uses (aiohttp connects to what
the resolver returns), so a name that resolved to a public address when the destination was
added and to 127.0.0.1 now (DNS rebinding) is refused at connect time. IP literals never reach
a resolver: ``gateway.core.addresses.host_refused`` judges those before the request. At
start, ``warn_refused`` names the enabled destinations the guard will refuse.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
from urllib.parse import urlsplit

import asyncpg
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver

from gateway.core.addresses import address_refused, host_refused
from gateway.core.settings import Settings
from gateway.store import deliveries

log = logging.getLogger(__name__)


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


async def warn_refused(pool: asyncpg.Pool, settings: Settings, timeout_s: float = 5.0) -> list[str]:
    """At start: the enabled destinations the private-address guard will refuse, each named in
    a warning (destinations added before the guard existed would otherwise just fail and be
    retried). A name that does not resolve now is left to the connect-time check."""
    if settings.forward_allow_private:
        return []
    refused: list[str] = []
    resolver = DefaultResolver()
    try:
        async with asyncio.timeout(timeout_s):
            async with pool.acquire() as conn:
                found = await deliveries.list_destinations(conn)
            for d in found:
                if not d.enabled:
                    continue
                try:
                    why = await url_refused(d.url, resolver)
                except OSError:
                    continue
                if why is not None:
                    refused.append(d.name)
                    log.warning(
                        "destination %s is refused by the private-address guard (%s): its deliveries "
                        "will fail and be retried; give it a public URL, or set "
                        "GATEWAY_FORWARD_ALLOW_PRIVATE=1 if private destinations are intended",
                        d.name,
                        why,
                    )
    except Exception as exc:  # a warning at best: never worth stopping the forwarder over
        log.debug("private-address check of the destinations skipped: %s", type(exc).__name__)
    finally:
        await resolver.close()
    return refused
