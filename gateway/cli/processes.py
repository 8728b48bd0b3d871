"""The commands that run the gateway's processes: serve, migrate, consume, send, forward."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

import asyncpg

from gateway import runtime
from gateway.core.settings import Settings, env_names
from gateway.store.db import migrate

log = logging.getLogger("gateway")


def serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        metavar="N",
        help="processes sharing the port (SO_REUSEPORT); default GATEWAY_WORKERS, 0: one per core",
    )
    # Internal: a worker started by the parent of `serve --workers N`.
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)


def cmd_serve(settings: Settings, ns: argparse.Namespace) -> int:
    from gateway.runtime import workers
    from gateway.web.app import build_app

    if ns.worker:
        workers.die_with_parent()
    if ns.workers is not None and ns.workers < 0:
        print("gateway serve: --workers must be >= 0", file=sys.stderr)
        return 2
    n = 1 if ns.worker else workers.count(settings, ns.workers)
    if n > 1 and settings.port == 0:
        print("gateway serve: several workers need a fixed GATEWAY_PORT, not 0", file=sys.stderr)
        return 2
    settings, server = runtime.resolve_database(settings)
    if n > 1:
        log.info("settings: %s", settings.redacted())
        return runtime.serve_workers(settings, n, embedded=server)
    runtime.install_uvloop()
    asyncio.run(runtime.wait_for(settings, schema=True))
    app = build_app(settings)
    if not ns.worker:
        log.info("settings: %s", settings.redacted())
    runtime.tune_gc()
    return runtime.serve_http(app, settings, embedded=server, reuse_port=ns.worker)


def cmd_migrate(settings: Settings, ns: argparse.Namespace) -> int:
    async def work(conn: asyncpg.Connection) -> int:
        applied = await migrate(conn)
        print(f"applied {len(applied)} migration(s): {applied}" if applied else "schema up to date")
        return 0

    return runtime.with_connection(settings, work)


def cmd_settings(settings: Settings, ns: argparse.Namespace) -> int:
    rows = env_names()
    width = max(len(name) for name, _, _ in rows)
    print(f"{'variable':{width}}  {'default':24}  what it does")
    for name, default, doc in rows:
        if len(default) > 24:  # a long default (a URL) gets its own line
            print(f"{name:{width}}  {default}\n{'':{width}}  {'':24}  {doc}")
        else:
            print(f"{name:{width}}  {default:24}  {doc}")
    return 0


def cmd_consume(settings: Settings, ns: argparse.Namespace) -> int:
    from gateway.inbound.consumer_group import ConsumerGroup

    async def work(pool: asyncpg.Pool, stop: asyncio.Event) -> None:
        group = ConsumerGroup(pool, settings)
        try:
            await group.start()
            log.info("%d consumer(s) running", settings.consumer_concurrency)
            await stop.wait()
        finally:
            await group.stop()

    return runtime.run_worker(settings, (1, settings.consumer_concurrency + 3), work, inbound=True)


def cmd_send(settings: Settings, ns: argparse.Namespace) -> int:
    from gateway.outbound.sender import Sender

    async def work(pool: asyncpg.Pool, stop: asyncio.Event) -> None:
        sender = Sender(pool, settings)
        log.info("sender running: %s", settings.redacted())
        try:
            await sender.run(stop)
        finally:
            await sender.close()

    return runtime.run_worker(settings, (settings.db_pool_min, settings.db_pool_max), work, outbound=True)


def cmd_forward(settings: Settings, ns: argparse.Namespace) -> int:
    from gateway.outbound.forwarder import Forwarder

    async def work(pool: asyncpg.Pool, stop: asyncio.Event) -> None:
        forwarder = Forwarder(pool, settings)
        log.info("forwarder running: %d requests in flight at most", settings.forward_concurrency)
        try:
            await forwarder.run(stop)
        finally:
            await forwarder.close()

    return runtime.run_worker(settings, (1, 4), work, forward=True)


def cmd_fake_provider(settings: Settings, ns: argparse.Namespace) -> int:
    # A test tool: imported only when asked for, never by the product.
    from gateway.testing import fake_provider

    try:
        fs = fake_provider.settings_from(settings, os.environ)
    except ValueError as exc:
        print(f"gateway: invalid configuration: {exc}", file=sys.stderr)
        return 2
    return runtime.run(fake_provider.serve(fs))


def cmd_console(settings: Settings, ns: argparse.Namespace) -> int:
    if not settings.console_port:
        print("gateway console: set GATEWAY_CONSOLE_PORT (and GATEWAY_CONSOLE_TOKENS)", file=sys.stderr)
        return 2
    settings, server = runtime.resolve_database(settings)
    return runtime.serve_console(settings, embedded=server)
