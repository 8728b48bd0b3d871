"""The commands that run the gateway's processes: serve, migrate, consume, send, forward."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

import asyncpg

from gateway.core.settings import Settings, env_names
from gateway.runtime import database, process, serve
from gateway.store.db import CitusLayoutError, migrate

log = logging.getLogger("gateway")


def serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        metavar="N",
        help="processes sharing the port (SO_REUSEPORT); default GATEWAY_WORKERS, 0: one per core",
    )
    # Internal: the children of a serve parent (gateway.runtime.workers): an HTTP worker, the
    # process of the background services, and the forwarder's when it runs apart from them.
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--services", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--forwarder", action="store_true", help=argparse.SUPPRESS)


def cmd_serve(settings: Settings, ns: argparse.Namespace) -> int:
    from gateway.runtime import services, workers

    if ns.worker or ns.services or ns.forwarder:
        workers.die_with_parent()
    if ns.services or ns.forwarder:  # the parent set GATEWAY_RUN_* for each
        return serve.run_services(settings, services.Roles.of_serve(settings))
    if ns.workers is not None and ns.workers < 0:
        print("gateway serve: --workers must be >= 0", file=sys.stderr)
        return 2
    roles = services.Roles.of_serve(settings)
    # The forwarder may get a process of its own only beside another service (alone, the
    # services process is already its own).
    beside = roles.forwarder and (roles.consumers or roles.sender)
    lay = workers.Layout(1, False) if ns.worker else workers.plan(settings, ns.workers, bool(roles), beside)
    if lay.http > 1 and settings.port == 0:
        print("gateway serve: several workers need a fixed GATEWAY_PORT, not 0", file=sys.stderr)
        return 2
    settings, server = database.resolve_database(settings)
    if lay.processes > 1:
        log.info("settings: %s", settings.redacted())
        return serve.serve_workers(settings, lay, embedded=server)
    process.install_uvloop()
    asyncio.run(database.wait_for(settings, schema=True))
    stop = asyncio.Event()  # set by a background service that fails: the process exits 1
    app = services.gateway_app(settings, on_failure=stop.set)
    if not ns.worker:
        log.info("settings: %s", settings.redacted())
    process.tune_gc()
    return serve.serve_http(app, settings, embedded=server, reuse_port=ns.worker, stop=stop)


def cmd_migrate(settings: Settings, ns: argparse.Namespace) -> int:
    async def work(conn: asyncpg.Connection) -> int:
        try:
            applied = await migrate(conn, citus=ns.citus)
        except CitusLayoutError as exc:
            print(f"gateway migrate: {exc}", file=sys.stderr)
            return 1
        print(f"applied {len(applied)} migration(s): {applied}" if applied else "schema up to date")
        return 0

    return database.with_connection(settings, work)


def migrate_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--citus",
        action="store_true",
        help="on a Citus coordinator: distribute the gateway's tables (sql/citus/layout.sql) after migrating",
    )


def settings_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--markdown", action="store_true", help="a Markdown page (the source of docs/settings.md)")


SETTINGS_PAGE = """# Settings

Every setting is an environment variable, read once when a process starts into one frozen
object (`gateway/core/settings.py`). A bad value stops the start with a line naming the
variable and what is wrong (a secret's value is never echoed); a `GATEWAY_*` variable that no
setting reads is reported with the closest known name. `gateway settings` prints the same list
as text.

This page is the output of `gateway settings --markdown`; `tests/unit/test_docs.py` fails when
it differs from the code.

| variable | default | what it does |
| --- | --- | --- |
"""


def settings_markdown() -> str:
    """Every setting as a Markdown table (docs/settings.md)."""

    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    rows = [f"| `{name}` | `{cell(default)}` | {cell(doc)} |" for name, default, doc in env_names()]
    return SETTINGS_PAGE + "\n".join(rows) + "\n"


def cmd_settings(settings: Settings, ns: argparse.Namespace) -> int:
    if ns.markdown:
        print(settings_markdown(), end="")
        return 0
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
    from gateway.runtime.services import Roles

    return serve.run_services(settings, Roles(consumers=True))


def cmd_send(settings: Settings, ns: argparse.Namespace) -> int:
    from gateway.runtime.services import Roles

    return serve.run_services(settings, Roles(sender=True))


def cmd_forward(settings: Settings, ns: argparse.Namespace) -> int:
    from gateway.runtime.services import Roles

    return serve.run_services(settings, Roles(forwarder=True))


def cmd_fake_provider(settings: Settings, ns: argparse.Namespace) -> int:
    # A test tool: imported only when asked for, never by the product.
    from gateway.testing import fake_provider

    try:
        fs = fake_provider.settings_from(settings, os.environ)
    except ValueError as exc:
        print(f"gateway: invalid configuration: {exc}", file=sys.stderr)
        return 2
    return process.run(fake_provider.serve(fs))


def cmd_console(settings: Settings, ns: argparse.Namespace) -> int:
    if not settings.console_port:
        print("gateway console: set GATEWAY_CONSOLE_PORT (and GATEWAY_CONSOLE_TOKENS)", file=sys.stderr)
        return 2
    settings, server = database.resolve_database(settings)
    return serve.serve_console(settings, embedded=server)
