"""The long-running commands' processes: ``gateway serve`` as one process (``serve_http``) or
as a parent supervising several (``serve_workers``, with gateway.runtime.workers), ``gateway
consume|send|forward`` (``run_services``: background services without HTTP) and ``gateway
console``. Each runs until SIGTERM/SIGINT; a failed service or an embedded PostgreSQL that
stays down ends it with exit status 1."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from aiohttp import web

from gateway.core.settings import Settings
from gateway.runtime import embedded as embedded_pg
from gateway.runtime import workers
from gateway.runtime.database import resolve_database, wait_for
from gateway.runtime.process import run, tune_gc
from gateway.runtime.startup import LISTEN_ERRNOS, listen_error
from gateway.store.db import create_pool, migrate_dsn
from gateway.web import server
from gateway.web.console.app import console_listener
from gateway.web.health import ListenError, health_socket, metrics_listener

if TYPE_CHECKING:  # services imports every layer: loaded by the commands that run them
    from gateway.runtime.services import Roles

log = logging.getLogger("gateway")


def _stop_on_signals(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)


def serve_http(
    app: web.Application,
    settings: Settings,
    *,
    embedded: Any = None,
    reuse_port: bool = False,
    stop: asyncio.Event | None = None,
) -> int:
    """Serve ``app`` with the edge limits (gateway.web.server) until SIGTERM/SIGINT or ``stop``
    (a service that failed sets it: see services.gateway_app), or until the embedded
    PostgreSQL is gone; exit status 1 for those two. ``reuse_port``: one of several workers."""
    stop = stop or asyncio.Event()

    async def go() -> int:
        _stop_on_signals(stop)
        try:
            listening = await server.listen(
                app, settings, settings.host, settings.port, shutdown_timeout=10, reuse_port=reuse_port
            )
        except ListenError as exc:  # the separate metrics listener (GATEWAY_METRICS_PORT)
            raise listen_error(exc, exc.host, exc.port, exc.variable) from None
        except OSError as exc:
            if exc.errno in LISTEN_ERRNOS:
                raise listen_error(exc, settings.host, settings.port) from None
            raise
        log.info("listening on http://%s:%d", settings.host, listening.port)
        watch = asyncio.create_task(embedded_pg.supervise(embedded, stop))
        # A worker of `serve --workers N` answers its parent's health checks on its own socket.
        sock = os.environ.get(workers.HEALTH_SOCKET_ENV) if reuse_port else None
        try:
            # One of several workers leaves the console to its parent: one listener in all.
            async with (
                health_socket(sock) if sock else contextlib.nullcontext(),
                _console(settings, enabled=not reuse_port),
            ):
                await stop.wait()
        finally:
            log.info("shutting down")
            await listening.close()
        from gateway.runtime.services import SERVICES

        failed = SERVICES in app and app[SERVICES].failed
        return 1 if await watch or failed else 0

    return run(go())


@contextlib.asynccontextmanager
async def _console(settings: Settings, *, enabled: bool = True) -> AsyncIterator[None]:
    """The operator console beside whatever runs (GATEWAY_CONSOLE_PORT; nothing when 0)."""
    if not (enabled and settings.console_port):
        yield
        return
    try:
        async with console_listener(settings):
            yield
    except ListenError as exc:
        raise listen_error(exc, exc.host, exc.port, exc.variable) from None


def serve_console(settings: Settings, *, embedded: Any = None) -> int:
    """`gateway console`: the console alone until SIGTERM/SIGINT."""

    async def go() -> int:
        assert settings.database_url
        await wait_for(settings, schema=True)
        if settings.migrate_on_start:
            await migrate_dsn(settings.database_url, timeout=settings.db_connect_timeout_s)
        stop = asyncio.Event()
        _stop_on_signals(stop)
        watch = asyncio.create_task(embedded_pg.supervise(embedded, stop))
        async with _console(settings):
            await stop.wait()
        return 1 if await watch else 0

    return run(go())


def serve_workers(settings: Settings, lay: workers.Layout, *, embedded: Any = None) -> int:
    """The parent of ``gateway serve`` as several processes: migrate once, then run and
    supervise the HTTP workers on one port and the services process, if apart
    (gateway.runtime.workers), until SIGTERM/SIGINT."""

    async def go() -> int:
        assert settings.database_url
        await wait_for(settings, schema=True)
        if settings.migrate_on_start:
            await migrate_dsn(settings.database_url, timeout=settings.db_connect_timeout_s)
        workers.check_free(settings.host, settings.port, "GATEWAY_PORT")
        if settings.metrics_port and not settings.metrics_public:
            workers.check_free(settings.host, settings.metrics_port, "GATEWAY_METRICS_PORT")
        if settings.console_port:
            workers.check_free(settings.console_host, settings.console_port, "GATEWAY_CONSOLE_PORT")
        metrics_dir = workers.make_metrics_dir()
        try:
            stop = asyncio.Event()
            _stop_on_signals(stop)
            supervisor = workers.Supervisor(
                workers.children(settings, lay, metrics_dir),
                metrics_dir,
                settings.worker_unresponsive_s,
                startup_s=settings.db_wait_s,
            )
            watch = asyncio.create_task(embedded_pg.supervise(embedded, stop))
            log.info(
                "serving http://%s:%d with %d HTTP worker process(es)%s",
                settings.host,
                settings.port,
                lay.http,
                (
                    " and processes for consumers and sender, and for the forwarder"
                    if lay.forwarder_apart
                    else " and a process for consumers, sender and forwarder"
                    if lay.services_apart
                    else ""
                ),
            )
            # The console runs here, in the parent, once: the children are started without it.
            async with _console(settings):
                await supervisor.run(stop)
            if supervisor.fatal is not None:
                watch.cancel()
                return supervisor.fatal  # the worker's own message is the last line
            log.info("all workers stopped")
            return 1 if await watch else 0
        finally:
            workers.remove_metrics_dir(metrics_dir)

    return run(go())


def run_services(settings: Settings, roles: Roles) -> int:
    """``gateway consume|send|forward``: the services ``roles`` names and the maintenance jobs
    that go with them, as a process of their own (no HTTP server; /metrics and /healthz on
    GATEWAY_METRICS_PORT if set) until SIGTERM/SIGINT, or until the embedded PostgreSQL is gone
    or a service fails (exit status 1)."""
    from gateway.runtime import services

    settings, pg = resolve_database(settings)

    async def go() -> int:
        assert settings.database_url
        await wait_for(settings, schema=True)
        # Before /healthz answers: a SIGTERM from then on is a graceful stop, even one that comes
        # while the pool is being made (the services then start and stop at once).
        stop = asyncio.Event()
        _stop_on_signals(stop)
        async with contextlib.AsyncExitStack() as stack:
            if settings.metrics_port:
                try:
                    await stack.enter_async_context(metrics_listener(settings.host, settings.metrics_port))
                except ListenError as exc:
                    raise listen_error(exc, exc.host, exc.port, exc.variable) from None
            if settings.migrate_on_start:
                await migrate_dsn(settings.database_url, timeout=settings.db_connect_timeout_s)
            size = services.pool_size(settings, roles)
            pool = await create_pool(settings.database_url, *size, timeout=settings.db_connect_timeout_s)
            stack.push_async_callback(pool.close)
            # The services process of `gateway serve` answers its parent's health checks.
            sock = os.environ.get(workers.HEALTH_SOCKET_ENV)
            if sock:
                await stack.enter_async_context(health_socket(sock))
            running = services.build(pool, settings, roles).all()
            # The consumers, the sender and the forwarder allocate per event what a worker
            # allocates per request: the same collector settings as `gateway serve`'s workers.
            tune_gc()
            watch = asyncio.create_task(embedded_pg.supervise(pg, stop))
            log.info("settings: %s", settings.redacted())
            log.info("running: %s", ", ".join(s.name for s in running))
            failed = await services.run(running, stop, on_failure=stop.set)
            stop.set()
            return 1 if await watch or failed else 0

    return run(go())
