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

from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver

from gateway.core.forwarding import address_refused


class RefusedAddress(OSError):
    """A destination's name resolved to an address the forwarder must not connect to."""


class GuardedResolver(AbstractResolver):
    def __init__(self, inner: AbstractResolver | None = None) -> None:
        self.inner = inner or DefaultResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        found = await self.inner.resolve(host, port, family)
        for r in found:
            why = address_refused(r["host"])
            if why is not None:
                # All or nothing: a name that also resolves inside is not used at all.
                why = f"{host} resolves to {why} (GATEWAY_FORWARD_ALLOW_PRIVATE)"
                raise RefusedAddress(errno.EACCES, why)  # aiohttp's error shows the strerror
        return found

    async def close(self) -> None:
        await self.inner.close()
