"""A lane's shard moved to another worker keeps its cursor's meaning: a lane numbers its own
rows (inbox_heads), so a worker that has counted fewer transactions than the one the shard left
does not make new rows look read (every one of them was skipped when rows carried the worker's
transaction id). Moves there and back, and staging while a move runs: every staged webhook is
processed once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest
import pytest_asyncio

from gateway.core.settings import Settings
from gateway.store import db, inbox
from gateway.testing import citus
from gateway.testing.payloads import message_obj, messages_payload, to_bytes
from tests.support.citus_db import (
    SpareDatabases,
    citus_dsn,
    node_dsn,
    nodes,
)
from tests.support.consume import drain

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture(scope="module")
def cluster_db(citus_module_database: citus.ReusableDatabase) -> str:
    return citus_module_database.dsn


@pytest_asyncio.fixture(loop_scope="module")
async def pool(cluster_db: str) -> AsyncIterator[asyncpg.Pool]:
    p = await db.create_pool(cluster_db, 1, 4)
    try:
        yield p
    finally:
        await p.close()


def name(dsn: str) -> str:
    """The database's name (the same on every node)."""
    return dsn.rsplit("/", 1)[1]


def settings(dsn: str) -> Settings:
    return Settings(database_url=dsn, run_consumers=False, run_sender=False, migrate_on_start=False)


async def stage(pool: asyncpg.Pool, tag: str, per_lane: int = 2) -> set[str]:
    """``per_lane`` messages in every lane, one batch per lane; their event keys."""
    keys: set[str] = set()
    for lane in range(32):
        wamids = [f"wamid.{tag}.{lane}.{i}" for i in range(per_lane)]
        bodies = [to_bytes(messages_payload(message_obj(w))) for w in wamids]
        await inbox.insert_batch(
            pool, sources=["meta"] * per_lane, bodies=bodies, delivery_ids=[None] * per_lane, lane=lane
        )
        keys |= {f"msg:{w}" for w in wamids}
    return keys


async def processed(pool: asyncpg.Pool, keys: set[str]) -> dict[str, int]:
    rows = await pool.fetch(
        "SELECT event_key, count(*) AS n FROM processed_webhook_events WHERE event_key = ANY ($1::text[])"
        " GROUP BY event_key",
        sorted(keys),
    )
    return {r["event_key"]: r["n"] for r in rows}


async def drain_until(pool: asyncpg.Pool, dsn: str, keys: set[str], timeout_s: float = 60) -> dict[str, int]:
    """The consumers run until every key is processed (or the time is up); what they did."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        await drain(pool, settings(dsn))
        got = await processed(pool, keys)
        if len(got) == len(keys) or loop.time() > deadline:
            return got
        await asyncio.sleep(0.2)


async def xid_next(dsn: str) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        return int(await conn.fetchval("SELECT pg_snapshot_xmax(pg_current_snapshot())::text"))
    finally:
        await conn.close()


async def burn(dsn: str, n: int) -> None:
    """``n`` transaction ids used up on the server of ``dsn`` (one committed transaction each)."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            f"DO $$ BEGIN FOR i IN 1..{n} LOOP PERFORM pg_current_xact_id(); COMMIT; END LOOP; END $$"
        )
    finally:
        await conn.close()


async def move_all(pool: asyncpg.Pool, source: tuple[str, int], target: tuple[str, int]) -> int:
    """Every shard of the lanes' group on ``source`` moved to ``target`` (with their colocated
    shards); how many."""
    shards = await pool.fetch(
        "SELECT s.shardid FROM pg_dist_shard s JOIN pg_dist_placement p USING (shardid)"
        " JOIN pg_dist_node n ON n.groupid = p.groupid"
        " WHERE s.logicalrelid = 'webhook_inbox'::regclass AND n.nodename = $1 AND n.nodeport = $2",
        *source,
    )
    for r in shards:
        await pool.execute(
            "SELECT citus_move_shard_placement($1, $2, $3, $4, $5, 'block_writes')",
            r["shardid"],
            *source,
            *target,
        )
    return len(shards)


async def move_lane(pool: asyncpg.Pool, lane: int, source: tuple[str, int], target: tuple[str, int]) -> None:
    """The shard of ``lane`` in the lanes' group moved from ``source`` to ``target``."""
    shard = await pool.fetchval(
        "SELECT get_shard_id_for_distribution_column('webhook_inbox', $1::smallint)", lane
    )
    await pool.execute(
        "SELECT citus_move_shard_placement($1, $2, $3, $4, $5, 'block_writes')", shard, *source, *target
    )


async def lanes_on(pool: asyncpg.Pool, worker: tuple[str, int]) -> set[int]:
    rows = await pool.fetch(
        "SELECT g.lane FROM generate_series(0, 31) AS g(lane), pg_dist_placement p, pg_dist_node n"
        " WHERE p.shardid = get_shard_id_for_distribution_column('webhook_inbox', g.lane::smallint)"
        " AND n.groupid = p.groupid AND n.nodename = $1 AND n.nodeport = $2",
        *worker,
    )
    return {r["lane"] for r in rows}


async def test_lanes_moved_to_a_worker_that_counted_fewer_transactions_read_every_new_row(
    cluster_db: str, pool: asyncpg.Pool
) -> None:
    _, (w1, w2) = await nodes(citus_dsn())
    first = await stage(pool, "first")
    assert await drain_until(pool, cluster_db, first) == dict.fromkeys(first, 1)
    # the worker the shards leave has counted far more transactions than the one they go to
    d1, d2 = node_dsn(cluster_db, *w1, name(cluster_db)), node_dsn(cluster_db, *w2, name(cluster_db))
    await burn(d1, max(0, await xid_next(d2) - await xid_next(d1)) + 3000)
    second = await stage(pool, "second")  # read on the first worker, by cursors in its numbers
    assert await drain_until(pool, cluster_db, second) == dict.fromkeys(second, 1)
    # One lane's shard (with the shards colocated with it) moves: what holds for it holds for
    # each, and a move copies every day partition of the group's tables.
    lanes_w1 = await lanes_on(pool, w1)
    lane = min(lanes_w1)
    await move_lane(pool, lane, w1, w2)
    assert lane in await lanes_on(pool, w2) and lane not in await lanes_on(pool, w1)

    third = await stage(pool, "third")
    got = await drain_until(pool, cluster_db, third)
    missing = sorted(k for k in third if k not in got)
    assert not missing, f"{len(missing)} of {len(third)} never processed, e.g. {missing[:3]}"
    assert got == dict.fromkeys(third, 1)

    # and back, to a worker that has now counted fewer than the second
    await burn(d2, max(0, await xid_next(d1) - await xid_next(d2)) + 3000)
    await move_lane(pool, lane, w2, w1)
    assert await lanes_on(pool, w1) == lanes_w1
    fourth = await stage(pool, "fourth")
    assert await drain_until(pool, cluster_db, fourth) == dict.fromkeys(fourth, 1)
    # and every webhook from before the moves is still there, once
    assert await processed(pool, first | second | third) == dict.fromkeys(first | second | third, 1)


async def test_webhooks_staged_while_shards_move_are_each_processed_once(
    cluster_db: str, pool: asyncpg.Pool
) -> None:
    _, (w1, w2) = await nodes(citus_dsn())
    source, target = (w1, w2) if await lanes_on(pool, w1) else (w2, w1)
    d_source, d_target = (
        node_dsn(cluster_db, *source, name(cluster_db)),
        node_dsn(cluster_db, *target, name(cluster_db)),
    )
    await burn(d_source, max(0, await xid_next(d_target) - await xid_next(d_source)) + 2000)
    staged: set[str] = set()
    stop = asyncio.Event()

    async def ingest() -> None:
        n = 0
        while not stop.is_set():
            staged.update(await stage(pool, f"during{n}", per_lane=1))
            n += 1

    async def consume() -> None:
        while not stop.is_set():
            await drain(pool, settings(cluster_db))
            await asyncio.sleep(0.05)

    tasks = [asyncio.create_task(ingest()), asyncio.create_task(consume())]
    try:
        await asyncio.sleep(0.5)
        assert await move_all(pool, source, target) > 0
        await asyncio.sleep(0.5)
    finally:
        stop.set()
        await asyncio.gather(*tasks)
    assert len(staged) >= 64
    got = await drain_until(pool, cluster_db, staged)
    missing = sorted(k for k in staged if k not in got)
    assert not missing, f"{len(missing)} of {len(staged)} never processed, e.g. {missing[:3]}"
    assert got == dict.fromkeys(staged, 1)


OLD_TRIGGER = (
    """CREATE FUNCTION webhook_inbox_txid() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        NEW.txid := pg_current_xact_id();
        RETURN NEW;
    END;
    $$""",
    "CREATE TRIGGER webhook_inbox_txid BEFORE INSERT ON webhook_inbox"
    " FOR EACH ROW EXECUTE FUNCTION webhook_inbox_txid()",
)


async def test_a_cluster_laid_out_with_transaction_ids_moves_to_lane_numbers_without_losing_a_row(
    citus_spares: SpareDatabases,
) -> None:
    """A database distributed before inbox_heads (rows numbered by the worker's transaction id,
    cursors in the worker's snapshots) takes `gateway migrate --citus`: the heads start above
    every number there, the rows staged and not read yet are read, and new rows after them."""
    spare = await citus_spares.take()  # migrated and distributed as `gateway migrate --citus` does
    dsn = spare.dsn
    conn = await db.connect(dsn)
    try:
        # The layout as it was: no heads, rows numbered by the worker's transaction id, each
        # lane's cursor at its worker's snapshot.
        await conn.execute("SELECT undistribute_table('inbox_heads')")
        await conn.execute("DROP TABLE inbox_heads")
        await conn.execute("DELETE FROM schema_migrations WHERE version = 25")
        await conn.execute("SET citus.enable_unsafe_triggers = on")
        await conn.execute("DROP TRIGGER webhook_inbox_number ON webhook_inbox")
        await conn.execute("DROP FUNCTION webhook_inbox_number()")
        for statement in OLD_TRIGGER:
            await conn.execute(statement)
        at_worker_snapshot = (
            "UPDATE %s SET done_snap = pg_current_snapshot(), win_snap = NULL, pos_txid = NULL,"
            " pos_id = NULL, version = version + 1"
        )
        assert await conn.fetchval(
            "SELECT bool_and(success) FROM run_command_on_shards('inbox_lanes', $1)", at_worker_snapshot
        )
        pool = await db.create_pool(dsn, 1, 4)
        try:
            read = await stage(pool, "read")  # read by the old cursors (moved past them)
            assert await conn.fetchval(
                "SELECT bool_and(success) FROM run_command_on_shards('inbox_lanes', $1)", at_worker_snapshot
            )
            unread = await stage(pool, "unread")  # staged, not read when the upgrade comes
            numbers = await conn.fetch(
                "SELECT lane, max(txid::text::bigint) AS top FROM webhook_inbox GROUP BY lane"
            )
            old = "SELECT count(*) FROM pg_trigger WHERE tgname = 'webhook_inbox_txid'"
            assert await conn.fetchval(old) > 0

            await db.migrate(conn, citus=True)
            assert await conn.fetchval(old) == 0
            heads = {r["lane"]: r["seq"] for r in await conn.fetch("SELECT lane, seq FROM inbox_heads")}
            assert all(heads[r["lane"]] >= r["top"] for r in numbers)
            after = await stage(pool, "after")
            got = await drain_until(pool, dsn, unread | after)
            missing = sorted(k for k in unread | after if k not in got)
            assert not missing, f"{len(missing)} never processed, e.g. {missing[:3]}"
            assert await processed(pool, read) == {}  # the old cursors had read them
        finally:
            await pool.close()
    finally:
        await conn.close()
        await spare.cluster.drop_database(spare.name)
