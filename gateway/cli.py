"""``gateway`` command line: every command, thin. Nothing imports this module."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Callable

import asyncpg

from gateway import __version__, runtime
from gateway.core.enums import OutboxState
from gateway.core.settings import Settings, SettingsError, env_names
from gateway.store import inbox, outbox
from gateway.store.db import migrate

log = logging.getLogger("gateway")

Command = Callable[[Settings, argparse.Namespace], int]


def cmd_serve(settings: Settings, ns: argparse.Namespace) -> int:
    from aiohttp import web

    from gateway.web.app import build_app

    settings, _server = runtime.resolve_database(settings)
    runtime.install_uvloop()
    app = build_app(settings)
    log.info("settings: %s", settings.redacted())
    runtime.tune_gc()
    web.run_app(
        app,
        host=settings.host,
        port=settings.port,
        access_log=None,
        shutdown_timeout=10,
        print=lambda msg: log.info("%s", msg.strip()),
    )
    return 0


def cmd_migrate(settings: Settings, ns: argparse.Namespace) -> int:
    async def work(conn: asyncpg.Connection) -> int:
        applied = await migrate(conn)
        print(f"applied {len(applied)} migration(s): {applied}" if applied else "schema up to date")
        return 0

    return runtime.with_connection(settings, work)


def cmd_settings(settings: Settings, ns: argparse.Namespace) -> int:
    for name, default, doc in env_names():
        print(f"{name:40} {default:40} {doc}")
    return 0


def cmd_consume(settings: Settings, ns: argparse.Namespace) -> int:
    from gateway.inbound.consumer import ConsumerGroup

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


def _one_line(text: str | None, width: int = 100) -> str:
    return " ".join((text or "").split())[:width]


def _dead_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=("list", "replay"))
    p.add_argument("ids", nargs="*", type=int, metavar="ID", help="rows to replay")
    p.add_argument("--all", action="store_true", help="replay every dead row")
    p.add_argument("--limit", type=int, default=100, help="rows to list (default 100)")


def cmd_dead(settings: Settings, ns: argparse.Namespace) -> int:
    """Dead letters: their raw bytes stay in ``webhook_inbox``; replaying is safe (an event
    already processed is a duplicate by its key and does nothing)."""
    if ns.action == "replay" and not ns.ids and not ns.all:
        print("gateway dead replay: give row ids or --all", file=sys.stderr)
        return 2
    if ns.action == "replay" and ns.ids and ns.all:
        print("gateway dead replay: give row ids or --all, not both", file=sys.stderr)
        return 2

    async def work(conn: asyncpg.Connection) -> int:
        if ns.action == "list":
            rows = await inbox.dead_list(conn, limit=ns.limit)
            total = await inbox.dead_count(conn)
            for r in rows:
                print(
                    f"{r.id:>10} {r.source:8} {r.received_at:%Y-%m-%dT%H:%M:%S%z} "
                    f"attempts={r.attempts} bytes={r.bytes} {_one_line(r.last_error)}"
                )
            print(f"{total} dead row(s)" + (f", {len(rows)} shown" if total > len(rows) else ""))
            return 0
        done = await inbox.dead_replay(conn, ids=None if ns.all else ns.ids)
        print(f"replayed {len(done)} row(s): {done}" if done else "nothing to replay")
        missing = sorted(set(ns.ids) - set(done))
        if missing:
            print(f"not dead (or unknown): {missing}")
        return 0 if not missing else 1

    return runtime.with_connection(settings, work)


def _outbox_args(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", required=True)
    ls = sub.add_parser("list", help="list outbox rows in a state")
    ls.add_argument("--state", default="review", choices=[s.value for s in OutboxState])
    ls.add_argument("--limit", type=int, default=100)
    actions = (("release", "send a review/unknown/failed row (again)"), ("cancel", "never send it"))
    for name, help_text in actions:
        a = sub.add_parser(name, help=help_text)
        a.add_argument("key")
        a.add_argument("--tenant", default=None, help="needed when several tenants use the key")


def cmd_outbox(settings: Settings, ns: argparse.Namespace) -> int:
    async def work(conn: asyncpg.Connection) -> int:
        if ns.action == "list":
            rows = await outbox.list_state(conn, state=ns.state, limit=ns.limit)
            print("tenant\tkey\tstate\trecipient\tattempts\tcode\terror\tupdated_at")
            for r in rows:
                cols = [r["tenant"], r["idem_key"], r["state"], r["recipient"], r["attempts"]]
                cols += [r["last_error_code"] or "", r["last_error"] or "", r["updated_at"].isoformat()]
                print("\t".join(str(c) for c in cols))
            return 0
        fn = outbox.release if ns.action == "release" else outbox.cancel
        try:
            print(await fn(conn, ns.key, ns.tenant))
        except outbox.AmbiguousKey as exc:
            print(f"gateway: key {ns.key!r} is used by tenants {exc}: pass --tenant", file=sys.stderr)
            return 2
        except (LookupError, ValueError) as exc:
            print(f"gateway: {exc}", file=sys.stderr)
            return 1
        return 0

    return runtime.with_connection(settings, work)


def cmd_fake_provider(settings: Settings, ns: argparse.Namespace) -> int:
    # A test tool: imported only when asked for, never by the product.
    from gateway.testing import fake_provider

    try:
        fs = fake_provider.settings_from(settings, os.environ)
    except ValueError as exc:
        print(f"gateway: invalid configuration: {exc}", file=sys.stderr)
        return 2
    return runtime.run(fake_provider.serve(fs))


# name -> (help, function, extra arguments)
COMMANDS: dict[str, tuple[str, Command, Callable[[argparse.ArgumentParser], None] | None]] = {
    "serve": ("run the HTTP gateway (with consumers and sender unless disabled)", cmd_serve, None),
    "migrate": ("apply pending database migrations and exit", cmd_migrate, None),
    "consume": ("run the consumers alone (no HTTP), until SIGTERM or SIGINT", cmd_consume, None),
    "send": ("run the sender (outbox → provider) and reconciler alone", cmd_send, None),
    "dead": ("dead letters: `dead list`, `dead replay ID...` or `dead replay --all`", cmd_dead, _dead_args),
    "outbox": ("list, release or cancel outbox rows", cmd_outbox, _outbox_args),
    "fake-provider": (
        "serve the fake Graph API / Tenashi API on GATEWAY_FAKE_HOST:GATEWAY_FAKE_PORT",
        cmd_fake_provider,
        None,
    ),
    "settings": ("print every GATEWAY_* variable with its default", cmd_settings, None),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gateway", description=__doc__)
    parser.add_argument("--version", action="version", version=f"gateway {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (help_text, _fn, add_args) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if add_args:
            add_args(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    try:
        settings = Settings.from_env(os.environ)
    except SettingsError as exc:
        print(f"gateway: {exc}", file=sys.stderr)
        return 2
    runtime.setup_logging(settings.log_level)
    _help, fn, _args = COMMANDS[ns.command]
    return fn(settings, ns)
