"""The Citus test cluster itself (gateway.testing.citus): it starts from the cached build,
distributes and routes, reports a dead worker and takes it back, and the shared test database
really goes back to its baseline between tests."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
from pathlib import Path

import asyncpg
import pytest

from gateway.testing import citus
from gateway.testing.scratch import scratch_database

pytestmark = pytest.mark.citus


@pytest.fixture
async def dist_dsn(citus_cluster: citus.Cluster) -> str:
    """A database of the cluster's own (not the gateway's) with a table distributed by ``k``."""
    name = "gw_dist_test"
    if name not in citus_cluster.databases:
        dsn = await citus_cluster.create_database(name)
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute("CREATE TABLE jobs (k int, id int, done bool NOT NULL DEFAULT false)")
            await conn.execute("SELECT create_distributed_table('jobs', 'k', shard_count => 8)")
            await conn.execute("INSERT INTO jobs (k, id) SELECT g % 16, g FROM generate_series(1, 200) g")
        finally:
            await conn.close()
    return citus_cluster.dsn(name)


async def test_two_workers_are_registered(citus_cluster: citus.Cluster, dist_dsn: str) -> None:
    conn = await asyncpg.connect(dist_dsn)
    try:
        ports = {r["node_port"] for r in await conn.fetch("SELECT * FROM citus_get_active_worker_nodes()")}
        placements = await conn.fetch(
            "SELECT DISTINCT nodeport FROM citus_shards WHERE table_name = 'jobs'::regclass"
        )
    finally:
        await conn.close()
    assert ports == {w.port for w in citus_cluster.workers}
    assert len(citus_cluster.workers) == 2
    assert {r["nodeport"] for r in placements} == ports  # the shards are spread over both


async def test_single_shard_skip_locked_is_routed_to_one_worker(
    citus_cluster: citus.Cluster, dist_dsn: str
) -> None:
    conn = await asyncpg.connect(dist_dsn)
    try:
        plan = "\n".join(
            r[0]
            for r in await conn.fetch(
                "EXPLAIN SELECT id FROM jobs WHERE k = 3 AND NOT done LIMIT 5 FOR UPDATE SKIP LOCKED"
            )
        )
        async with conn.transaction():
            locked = await conn.fetch(
                "SELECT id FROM jobs WHERE k = 3 AND NOT done ORDER BY id LIMIT 5 FOR UPDATE SKIP LOCKED"
            )
            other = await asyncpg.connect(dist_dsn)
            try:  # a second consumer skips the rows the first holds
                skipped = await other.fetch(
                    "SELECT id FROM jobs WHERE k = 3 AND NOT done ORDER BY id LIMIT 5 FOR UPDATE SKIP LOCKED"
                )
            finally:
                await other.close()
        with pytest.raises(asyncpg.FeatureNotSupportedError):
            await conn.fetch("SELECT id FROM jobs WHERE NOT done LIMIT 5 FOR UPDATE SKIP LOCKED")
    finally:
        await conn.close()
    assert "Task Count: 1" in plan
    nodes = [line for line in plan.splitlines() if "Node: host=" in line]
    assert len(nodes) == 1 and any(f"port={w.port} " in nodes[0] for w in citus_cluster.workers)
    assert [r["id"] for r in locked] == [3, 19, 35, 51, 67]
    assert [r["id"] for r in skipped] == [83, 99, 115, 131, 147]


def test_the_build_is_reused(citus_cluster: citus.Cluster) -> None:
    marker = citus_cluster.root / citus.MARKER
    tarball = os.environ.get("CITUS_TARBALL") or json.loads(marker.read_text())["path"]
    if not Path(tarball).is_file():
        pytest.skip(f"the tarball the build came from is gone ({tarball}) and CITUS_TARBALL is not set")
    built_at = marker.stat().st_mtime_ns
    assert citus.build(Path(tarball), citus_cluster.root.parent) == citus_cluster.root
    assert marker.stat().st_mtime_ns == built_at
    assert not (citus_cluster.root / "build.log").stat().st_mtime_ns > built_at


async def test_a_killed_worker_is_reported_down_and_comes_back(
    citus_cluster: citus.Cluster, dist_dsn: str
) -> None:
    worker = citus_cluster.workers[0]
    assert await citus_cluster.reachable("gw_dist_test") == {w.name: True for w in citus_cluster.workers}
    citus_cluster.kill(worker)
    try:
        assert not worker.running()
        seen = await citus_cluster.reachable("gw_dist_test")
        assert seen == {w.name: w is not worker for w in citus_cluster.workers}
        conn = await asyncpg.connect(dist_dsn)
        try:
            with pytest.raises(asyncpg.PostgresError):  # every shard is needed for a count
                await conn.fetchval("SELECT count(*) FROM jobs")
        finally:
            await conn.close()
    finally:
        await asyncio.to_thread(citus_cluster.restart, worker)
    assert worker.running()
    assert await citus_cluster.reachable("gw_dist_test") == {w.name: True for w in citus_cluster.workers}
    conn = await asyncpg.connect(dist_dsn)
    try:
        assert await conn.fetchval("SELECT count(*) FROM jobs") == 200
    finally:
        await conn.close()


PROBE_SCHEMA = """
CREATE TABLE lanes (lane int PRIMARY KEY, cursor bigint NOT NULL DEFAULT 0);
SELECT create_reference_table('lanes');
INSERT INTO lanes (lane) SELECT generate_series(0, 7);
CREATE TABLE items (id bigserial, k int NOT NULL, twice int GENERATED ALWAYS AS (k * 2) STORED,
                    PRIMARY KEY (k, id));
SELECT create_distributed_table('items', 'k', shard_count => 8);
CREATE TABLE notes (id int GENERATED ALWAYS AS IDENTITY PRIMARY KEY, note text);
"""


@pytest.fixture
async def probe(citus_cluster: citus.Cluster) -> citus.ReusableDatabase:
    """A small database of its own (a reference table with seeded rows, a distributed table
    with a sequence and a generated column, a local identity table), at its baseline."""
    db = citus.ReusableDatabase(citus_cluster, "gw_reset_probe")
    if db.name in citus_cluster.databases:
        await citus_cluster.drop_database(db.name)
    await citus_cluster.create_database(db.name)
    conn = await asyncpg.connect(db.dsn)
    try:
        await conn.execute(PROBE_SCHEMA)
    finally:
        await conn.close()
    await db.snapshot()
    return db


async def test_a_reset_database_is_back_at_its_baseline(probe: citus.ReusableDatabase) -> None:
    conn = await asyncpg.connect(probe.dsn)
    try:
        lanes = await conn.fetch("SELECT * FROM lanes ORDER BY lane")
        first = await conn.fetch("INSERT INTO items (k) SELECT generate_series(1, 20) RETURNING id, k")
        await conn.execute("INSERT INTO notes (note) VALUES ('a'), ('b')")
        await conn.execute("UPDATE lanes SET cursor = cursor + 5 WHERE lane < 3")
        await conn.execute("DELETE FROM lanes WHERE lane = 7")
        # A session still open, in a transaction holding row locks, when the test ends.
        await conn.execute("BEGIN; SELECT * FROM items WHERE k = 1 FOR UPDATE; UPDATE lanes SET cursor = 9")
        assert await probe.reset()
        conn = await asyncpg.connect(probe.dsn)
        assert await conn.fetchval("SELECT count(*) FROM items") == 0
        assert await conn.fetchval("SELECT count(*) FROM notes") == 0
        assert await conn.fetch("SELECT * FROM lanes ORDER BY lane") == lanes
        again = await conn.fetch("INSERT INTO items (k) SELECT generate_series(1, 20) RETURNING id, k")
        assert sorted(map(tuple, again)) == sorted(map(tuple, first))
        assert await conn.fetchval("INSERT INTO notes (note) VALUES ('c') RETURNING id") == 1
        assert await conn.fetchval("SELECT sum(twice) FROM items") == 420
    finally:
        await conn.close()
    assert await probe.reset()


async def test_a_changed_schema_is_not_reset_in_place(probe: citus.ReusableDatabase) -> None:
    async def run(sql: str) -> None:
        conn = await asyncpg.connect(probe.dsn)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    await run("CREATE TABLE extra (k int)")
    assert not await probe.reset()
    await run("DROP TABLE extra")
    assert await probe.reset()
    # A rule a failed test left behind: a CHECK (on every shard too), a trigger on a built-in
    # function (no function of its own to show it).
    await run("ALTER TABLE items ADD CONSTRAINT newer CHECK (k > -1)")
    assert not await probe.reset()
    await run("ALTER TABLE items DROP CONSTRAINT newer")
    assert await probe.reset()
    await run(
        "CREATE TRIGGER same BEFORE UPDATE ON notes FOR EACH ROW"
        " EXECUTE FUNCTION suppress_redundant_updates_trigger()"
    )
    assert not await probe.reset()
    await run("DROP TRIGGER same ON notes")
    assert await probe.reset()
    await run("SELECT create_distributed_table('notes', 'id')")  # shards made on the workers
    assert not await probe.reset()


async def test_the_admin_dsn_is_the_coordinator(citus_cluster: citus.Cluster, pg_admin_dsn: str) -> None:
    async with scratch_database(pg_admin_dsn, "gw_plain") as dsn:
        conn = await asyncpg.connect(dsn)
        try:
            assert await conn.fetchval("SHOW port") == str(citus_cluster.coordinator.port)
        finally:
            await conn.close()


async def test_an_added_worker_takes_shards_in_a_rebalance(citus_cluster: citus.Cluster) -> None:
    """On a cluster of its own: the session's keeps its two workers."""
    base = Path(tempfile.mkdtemp(prefix="gateway-test-citus-"))
    os.chmod(base, 0o755)  # noqa: S103 - the postgres user must traverse it
    cluster = citus.Cluster(citus_cluster.root, base, fsync=False)
    try:
        await asyncio.to_thread(cluster.start)
        dsn = await cluster.create_database("gw_rebalance")
        db = citus.ReusableDatabase(cluster, "gw_rebalance")
        await db.snapshot()
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute("CREATE TABLE t (k int PRIMARY KEY, v int)")
            await conn.execute("SELECT create_distributed_table('t', 'k', shard_count => 8)")
            await conn.execute("INSERT INTO t SELECT g, g FROM generate_series(1, 1000) g")
            added = await cluster.add_worker()
            assert added.running() and cluster.workers[-1] is added
            await conn.execute("SELECT citus_rebalance_start()")
            await conn.execute("SELECT citus_rebalance_wait()")
            per_node = dict(await conn.fetch("SELECT nodeport, count(*) FROM citus_shards GROUP BY nodeport"))
            assert await conn.fetchval("SELECT count(*) FROM t") == 1000
        finally:
            await conn.close()
        assert per_node.get(added.port, 0) > 0 and sum(per_node.values()) == 8
        assert await cluster.reachable("gw_rebalance") == {w.name: True for w in cluster.workers}
        assert not await db.reset()  # a node the baseline does not know: the database is replaced
    finally:
        await asyncio.to_thread(cluster.stop)
        shutil.rmtree(base, ignore_errors=True)
