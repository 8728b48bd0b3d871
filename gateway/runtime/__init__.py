"""Process start-up and shutdown: logging, uvloop, GC tuning, the database (embedded when no
DSN is given), ``gateway serve`` (one process, or several worker processes on one port) and
the processes that run background services alone (gateway.runtime.services). Only the CLI
imports this package."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import logging
import os
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import asyncpg
from aiohttp import web

from gateway.core.aio import sleep_unless_stopped
from gateway.core.heartbeat import HEARTBEATS, Beat
from gateway.core.limits import LogThrottle
from gateway.core.settings import Settings
from gateway.runtime import logs, workers
from gateway.runtime.startup import (
    LISTEN_ERRNOS,
    StartupError,
    listen_error,
    wait_for_database,
    wait_for_schema,
)
from gateway.store import sqlfiles
from gateway.store.db import connect, create_pool, migrate_dsn
from gateway.web import server
from gateway.web.console.app import console_listener
from gateway.web.health import ListenError, health_socket, metrics_listener

if TYPE_CHECKING:  # services imports every layer: loaded by the commands that run them
    from gateway.runtime.services import Roles

log = logging.getLogger("gateway")


def setup_logging(level: str, fmt: str = "text", secrets: Iterable[str] = ()) -> None:
    """Logging for the process (gateway.runtime.logs), and asyncpg's pool reconnect noise
    throttled."""
    logs.setup_logging(level, fmt, secrets)
    # asyncpg's pool logs a traceback every second while it cannot reconnect.
    logging.getLogger("asyncpg.pool").addFilter(_Throttled(30.0))


class _Throttled(logging.Filter):
    """At most one record per message per interval, without its traceback."""

    def __init__(self, interval_s: float) -> None:
        super().__init__()
        self._throttle = LogThrottle(interval_s)

    def filter(self, record: logging.LogRecord) -> bool:
        held = self._throttle.allow(str(record.msg), time.monotonic())
        if held is None:
            return False
        text = record.getMessage()
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None:
            text += f": {type(exc).__name__}: {exc}"
        record.msg, record.args = text + self._throttle.suffix(held), None
        record.exc_info = record.exc_text = None
        return True


def install_uvloop() -> None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency off Windows
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def tune_gc() -> None:
    """Fewer, cheaper collections for a long-running server.

    Every request allocates a few hundred short-lived objects, so the default gen-0
    threshold (700) runs a collection every couple of requests; the modules and app
    loaded at start-up are frozen so no collection ever walks them again.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, 10, 10)


def resolve_database(settings: Settings) -> tuple[Settings, Any]:
    """Fill in ``database_url`` from the embedded server when it is unset (and allowed)."""
    if settings.database_url:
        return settings, None
    if not settings.embedded:
        raise StartupError(
            "DATABASE_URL is not set and GATEWAY_EMBEDDED=0: set DATABASE_URL to your PostgreSQL "
            "(or GATEWAY_EMBEDDED=1 for a throwaway embedded database)"
        )
    from gateway.runtime import embedded

    server, dsn = embedded.start(settings.data_dir)
    return dataclasses.replace(settings, database_url=dsn), server


EMBEDDED_GRACE_S = 10.0


async def supervise_embedded(pg: Any, stop: asyncio.Event) -> bool:
    """Watch the embedded PostgreSQL (``pg`` from resolve_database; None: nothing to watch).

    When it has been down for ``EMBEDDED_GRACE_S`` (long enough for an operator's restart in
    place), say so, set ``stop`` and return True: the process exits non-zero, so a supervisor
    restarts it and the restart starts the server again. Without this a crashed server left
    the process up, ``/healthz`` at 200, for ever.
    """
    if pg is None:
        return False
    pgdata = Path(pg.pgdata)
    beat = HEARTBEATS.loop("embedded PostgreSQL watch", 60.0)
    try:
        return await _watch_embedded(pgdata, stop, beat)
    finally:
        beat.done()


async def _watch_embedded(pgdata: Path, stop: asyncio.Event, beat: Beat) -> bool:
    from gateway.runtime import embedded

    down_since: float | None = None
    while not stop.is_set():
        beat()
        now = time.monotonic()
        if embedded.running(pgdata):
            if down_since is not None:
                log.warning("embedded PostgreSQL under %s is running again", pgdata)
            down_since = None
        elif down_since is None:
            down_since = now
            log.warning("embedded PostgreSQL under %s is not running", pgdata)
        elif now - down_since >= EMBEDDED_GRACE_S:
            log.error(
                "embedded PostgreSQL under %s has been down for %.0f s: exiting; start the gateway "
                "again to restart it (its log: %s)",
                pgdata,
                now - down_since,
                pgdata / "log",
            )
            stop.set()
            return True
        if await sleep_unless_stopped(stop, 1.0):
            break
    return False


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
        watch = asyncio.create_task(supervise_embedded(embedded, stop))
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
        watch = asyncio.create_task(supervise_embedded(embedded, stop))
        async with _console(settings):
            await stop.wait()
        return 1 if await watch else 0

    return run(go())


async def wait_for(settings: Settings, *, schema: bool = False) -> None:
    """Wait (GATEWAY_DB_WAIT_S) for the database the settings name and, with ``schema`` where
    this process does not migrate itself (GATEWAY_MIGRATE_ON_START=false), for its schema."""
    assert settings.database_url
    lacking = sqlfiles.missing()
    if lacking:
        raise StartupError(
            f"this installation lacks {len(lacking)} of its SQL files (sql/): "
            f"{', '.join(lacking[:5])}; rebuild the image or reinstall the package"
        )
    dsn, timeout_s = settings.database_url, settings.db_connect_timeout_s
    await wait_for_database(dsn, wait_s=settings.db_wait_s, connect_timeout_s=timeout_s)
    if schema and not settings.migrate_on_start:
        await wait_for_schema(dsn, wait_s=settings.db_wait_s, connect_timeout_s=timeout_s)


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
            watch = asyncio.create_task(supervise_embedded(embedded, stop))
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


def run(coro: Coroutine[Any, Any, int]) -> int:
    install_uvloop()
    return asyncio.run(coro)


def with_connection(settings: Settings, work: Callable[[asyncpg.Connection], Awaitable[int]]) -> int:
    """Operator commands: resolve the database, run ``work`` on one connection, close it."""
    settings, _server = resolve_database(settings)

    async def go() -> int:
        assert settings.database_url
        await wait_for(settings)
        conn = await connect(settings.database_url, timeout=settings.db_connect_timeout_s)
        try:
            return await work(conn)
        finally:
            await conn.close()

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
            watch = asyncio.create_task(supervise_embedded(pg, stop))
            log.info("settings: %s", settings.redacted())
            log.info("running: %s", ", ".join(s.name for s in running))
            failed = await services.run(running, stop, on_failure=stop.set)
            stop.set()
            return 1 if await watch or failed else 0

    return run(go())
