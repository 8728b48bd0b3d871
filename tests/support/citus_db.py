"""Databases on a Citus cluster for the tests of tests/citus: the cluster is the one whose
coordinator ``GATEWAY_TEST_CITUS_DSN`` names (any database on it with the citus extension and
the workers registered: `make test-citus` starts one). A fresh database is made on every node
it lists (the workers are reached as the coordinator knows them, with the same user). And the
session's migrated databases (``new_citus_database``, ``SpareDatabases``: tests/conftest.py's
fixtures hand them out)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from gateway.store import db
from gateway.testing import citus

ENV = "GATEWAY_TEST_CITUS_DSN"


def citus_dsn() -> str:
    """The coordinator's DSN, or the test is skipped (no cluster in this run)."""
    dsn = os.environ.get(ENV)
    if not dsn:
        pytest.skip(f"{ENV} is not set (a Citus coordinator: `make test-citus`)")
    return dsn


async def _run(dsn: str, *statements: str) -> None:
    conn = await asyncpg.connect(dsn, timeout=30)
    try:
        for sql in statements:
            await conn.execute(sql)
    finally:
        await conn.close()


async def nodes(dsn: str) -> tuple[tuple[str, int], list[tuple[str, int]]]:
    """(the coordinator, the workers) as registered in ``dsn``'s database."""
    conn = await asyncpg.connect(dsn, timeout=30)
    try:
        rows = await conn.fetch(
            "SELECT groupid, nodename, nodeport FROM pg_dist_node WHERE isactive ORDER BY nodeid"
        )
    finally:
        await conn.close()
    coordinator = [(r["nodename"], r["nodeport"]) for r in rows if r["groupid"] == 0]
    workers = [(r["nodename"], r["nodeport"]) for r in rows if r["groupid"] != 0]
    assert coordinator and workers, f"{ENV} names a database without a registered coordinator and workers"
    return coordinator[0], workers


def node_dsn(dsn: str, host: str, port: int, database: str) -> str:
    user = dsn.partition("://")[2].partition("@")[0] if "@" in dsn else "postgres"
    return f"postgresql://{user}@{host}:{port}/{database}"


async def drop_database(dsn: str, name: str) -> None:
    coordinator, workers = await nodes(dsn)
    for host, port in [*workers, coordinator]:
        await _run(node_dsn(dsn, host, port, "postgres"), f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def plain_database(dsn: str, name: str) -> str:
    """A database on the coordinator's server without the extension: one PostgreSQL, as a
    deployment before its move to Citus. Its DSN."""
    await drop_database(dsn, name)
    coordinator, _ = await nodes(dsn)
    await _run(node_dsn(dsn, *coordinator, "postgres"), f'CREATE DATABASE "{name}"')
    return db.with_database(dsn, name)


async def join_cluster(dsn: str, name: str, *, create: bool = True) -> str:
    """Database ``name`` made a Citus database: on every worker (created there when ``create``),
    the extension in each, the coordinator and the workers registered. Its coordinator DSN."""
    coordinator, workers = await nodes(dsn)
    for host, port in workers:
        if create:
            await _run(node_dsn(dsn, host, port, "postgres"), f'CREATE DATABASE "{name}"')
        await _run(node_dsn(dsn, host, port, name), "CREATE EXTENSION IF NOT EXISTS citus")
    target = node_dsn(dsn, *coordinator, name)
    await _run(
        target,
        "CREATE EXTENSION IF NOT EXISTS citus",
        f"SELECT citus_set_coordinator_host('{coordinator[0]}', {coordinator[1]})",
        *(f"SELECT citus_add_node('{h}', {p})" for h, p in workers),
    )
    return target


async def fresh_database(dsn: str, name: str) -> str:
    """An empty Citus database ``name`` on every node; its coordinator DSN."""
    await plain_database(dsn, name)
    return await join_cluster(dsn, name)


def on_cluster() -> bool:
    """Whether this test session runs on a Citus cluster (make test-citus: GATEWAY_TEST_CITUS)."""
    return bool(os.environ.get("GATEWAY_TEST_CITUS"))


async def new_citus_database(cluster: citus.Cluster) -> citus.ReusableDatabase:
    """A database of ``cluster`` as `gateway migrate --citus` leaves it, its baseline kept."""
    made = citus.ReusableDatabase(cluster, f"gw_citus_{uuid.uuid4().hex[:8]}")
    await cluster.create_database(made.name)
    conn = await db.connect(made.dsn, timeout=30)
    try:
        await db.migrate(conn, citus=True)
    finally:
        await conn.close()
    await made.snapshot()
    return made


class SpareDatabases:
    """The next migrated database, made in a thread while the tests run: a test that changes
    the schema (a partition made, a shard moved) leaves its database unusable, and migrating and
    distributing another takes ~7 s, mostly spent waiting on the nodes' DDL. A spare made while
    a test killed a node fails: the database is then made when it is needed."""

    def __init__(self, cluster: citus.Cluster) -> None:
        self.cluster = cluster
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="citus-spare")
        self._next: concurrent.futures.Future[citus.ReusableDatabase] | None = None

    def prepare(self) -> None:
        if self._next is None:
            self._next = self._pool.submit(asyncio.run, new_citus_database(self.cluster))

    async def take(self) -> citus.ReusableDatabase:
        ready, self._next = self._next, None
        spare: citus.ReusableDatabase | None = None
        if ready is not None:
            with contextlib.suppress(Exception):
                spare = await asyncio.wrap_future(ready)
        if spare is None or not await spare.reset():
            if spare is not None:
                await self.cluster.drop_database(spare.name)
            spare = await new_citus_database(self.cluster)
        self.prepare()
        return spare

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


@contextlib.contextmanager
def own_cluster(
    build: citus.Cluster, name: str, *, workers: int = 2, settings: dict[str, str] | None = None
) -> Iterator[citus.Cluster]:
    """A cluster of its own from ``build``'s Citus build, for tests that kill its nodes (which the
    session's cluster of the other tests must not see)."""
    base = Path(tempfile.mkdtemp(prefix=f"gateway-citus-{name}-"))
    os.chmod(base, 0o755)  # noqa: S103 - the postgres user must traverse it
    # fsync off: the tests kill processes, never the machine (the page cache keeps what they wrote).
    cluster = citus.Cluster(build.root, base, workers, fsync=False, settings=settings)
    try:
        cluster.start()
        yield cluster
    finally:
        # Thrown away: killed rather than stopped (a clean stop checkpoints thousands of
        # shard files, 40 s here).
        for node in cluster.nodes:
            cluster.kill(node, wait=False)
        # Removed in the background: thousands of shard files, ~10 s the other tests need not wait.
        subprocess.Popen(["rm", "-rf", str(base)], start_new_session=True)
