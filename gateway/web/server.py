"""The HTTP server the gateway listens with: aiohttp's, with the limits a public endpoint needs.

aiohttp's defaults suit a server behind a proxy, not one facing the internet: an idle or
half-sent connection is kept for an hour, connections are unbounded, bodies are inflated
before the handler sees them, and every malformed request or vanished client is logged as
an ERROR traceback. Here:

- ``GATEWAY_HEADER_TIMEOUT_S`` is aiohttp's keep-alive timeout, which (since aiohttp 3.10)
  also runs from the moment a connection opens and closes it whenever no complete request
  has arrived in time: it bounds an idle keep-alive connection *and* a client dripping its
  headers. The body has its own deadline (``GATEWAY_BODY_TIMEOUT_S``, in the webhook handler).
- ``GATEWAY_MAX_CONNECTIONS`` caps open connections; one past the cap is answered 503 and
  closed at once, so the process cannot run out of descriptors.
- ``auto_decompress=False``: a ``Content-Encoding: gzip`` body stays as sent (the webhook
  routes refuse it with 415), so no CPU is spent inflating, and a signature is only ever
  checked over the bytes on the wire.
- After an early answer (401, 408, 413, 415, 503 before the body is read whole) the
  connection is half-closed (``httpkit.ClosingResponse``) and aiohttp keeps reading and
  discarding for at most ``LINGER_S``, then closes: the client sees the answer and its end
  rather than a reset, and a slow client holds the connection that much longer at most.
- Client faults (malformed requests, disconnects) are logged at DEBUG without a traceback.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any, cast

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from yarl import URL

from gateway import metrics
from gateway.core.settings import Settings

log = logging.getLogger(__name__)

LINGER_S = 2.0
MAX_LINE = 8190  # request line and each header line (aiohttp's default, stated here on purpose)
MAX_HEADERS = 64
# The canned answer to a connection over the cap: no request is read, nothing else is said.
_REFUSED_BODY = b'{"type":"about:blank","title":"too many connections, retry later","status":503}'
REFUSED = (
    b"HTTP/1.1 503 Service Unavailable\r\n"
    b"Content-Type: application/problem+json\r\n"
    b"Content-Length: " + str(len(_REFUSED_BODY)).encode() + b"\r\n"
    b"Retry-After: 1\r\nConnection: close\r\n\r\n" + _REFUSED_BODY
)
# What a client can cause: a malformed request, a connection that went away mid-request.
CLIENT_FAULTS = (HttpProcessingError, ConnectionError, web.RequestPayloadError, asyncio.IncompleteReadError)


class _ServerLog(logging.LoggerAdapter):  # type: ignore[type-arg]
    """aiohttp's server logger, with client faults demoted to one DEBUG line, no traceback."""

    def log(
        self,
        level: int,
        msg: object,
        *args: object,
        exc_info: Any = None,
        stack_info: bool = False,
        stacklevel: int = 1,
        extra: Mapping[str, object] | None = None,
        **kwargs: object,
    ) -> None:
        if isinstance(exc_info, CLIENT_FAULTS):
            text = str(msg) % args if args else str(msg)
            self.logger.debug("%s: %s: %s", text, type(exc_info).__name__, exc_info)
            return
        self.logger.log(level, msg, *args, exc_info=exc_info, stack_info=stack_info, extra=extra)


SERVER_LOG = _ServerLog(logging.getLogger("gateway.http"), {})


def handler_args(s: Settings) -> dict[str, Any]:
    """Keyword arguments for aiohttp's request handler (``AppRunner(app, **handler_args(s))``)."""
    return {
        "keepalive_timeout": s.header_timeout_s,
        "lingering_time": LINGER_S,
        "auto_decompress": False,
        "max_line_size": MAX_LINE,
        "max_field_size": MAX_LINE,
        "max_headers": MAX_HEADERS,
        "logger": SERVER_LOG,
        "access_log": None,
    }


class _Counted(asyncio.Protocol):
    """aiohttp's protocol for one connection, counted while it is open."""

    def __init__(self, inner: asyncio.Protocol, site: CappedSite) -> None:
        self._inner = inner
        self._site = site

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self._site.open -= 1
        metrics.HTTP_CONNECTIONS.dec()
        self._inner.connection_lost(exc)


class _Refuse(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        cast(asyncio.Transport, transport).write(REFUSED)
        transport.close()


class CappedSite(web.BaseSite):
    """A TCP site that keeps at most ``max_connections`` connections open."""

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        max_connections: int,
        *,
        backlog: int,
        reuse_port: bool = False,
    ) -> None:
        super().__init__(runner)
        self._backlog = backlog
        self._host = host
        self._port = port
        self._reuse_port = reuse_port
        self.max_connections = max_connections
        self.open = 0
        self.refused = 0
        self._listener: asyncio.Server | None = None

    @property
    def name(self) -> str:
        return str(URL.build(scheme="http", host=self._host, port=self.port))

    @property
    def port(self) -> int:
        """The bound port (the real one when 0 was asked for)."""
        if self._listener is not None and self._listener.sockets:
            return int(self._listener.sockets[0].getsockname()[1])
        return self._port

    def _protocol(self) -> asyncio.Protocol:
        if self.open >= self.max_connections:
            self.refused += 1
            metrics.HTTP_CONNECTIONS_REFUSED.inc()
            return _Refuse()
        server = self._runner.server
        assert server is not None
        self.open += 1
        metrics.HTTP_CONNECTIONS.inc()
        return _Counted(server(), self)

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        # reuse_port: `gateway serve --workers N` binds N processes to one port (SO_REUSEPORT);
        # the kernel spreads new connections over them.
        # backlog: asyncio's default of 100 overflows when a sender opens connections in a
        # burst (Meta's retries after an outage, a load balancer's pool filling): the kernel
        # then drops the SYNs past it and each of those clients waits for its retransmission,
        # a second, before its request is even sent.
        self._listener = await loop.create_server(
            self._protocol,
            self._host,
            self._port,
            backlog=self._backlog,
            reuse_address=True,
            reuse_port=self._reuse_port or None,
        )
        self._server = self._listener  # BaseSite.stop() closes it


class Listening:
    """A started app: its runner and site; ``close()`` shuts both down."""

    def __init__(self, app: web.Application, runner: web.AppRunner, site: CappedSite, host: str) -> None:
        self.app = app
        self.runner = runner
        self.site = site
        self.host = host

    @property
    def port(self) -> int:
        return self.site.port

    def make_url(self, path: str) -> URL:
        return URL.build(scheme="http", host=self.host, port=self.port).join(URL(path))

    async def close(self) -> None:
        await self.runner.cleanup()


async def listen(
    app: web.Application,
    settings: Settings,
    host: str,
    port: int,
    shutdown_timeout: float = 10.0,
    *,
    reuse_port: bool = False,
) -> Listening:
    """Start ``app`` (its cleanup contexts included) on ``host:port`` with the edge limits."""
    runner = web.AppRunner(
        app, handle_signals=False, shutdown_timeout=shutdown_timeout, **handler_args(settings)
    )
    await runner.setup()
    site = CappedSite(
        runner, host, port, settings.max_connections, backlog=settings.listen_backlog, reuse_port=reuse_port
    )
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    return Listening(app, runner, site, host)
