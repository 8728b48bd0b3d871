"""GroupCommitter against a real PostgreSQL: batching, failure, drain on close."""

from __future__ import annotations

import asyncio
import time
from functools import partial

import asyncpg
import pytest

from gateway.inbound import groupcommit
from gateway.inbound.groupcommit import GroupCommitter, Unavailable
from gateway.store.db import connect


async def test_size_bound_cuts_batches(pool: asyncpg.Pool, db_dsn: str) -> None:
    gc = GroupCommitter(partial(connect, db_dsn), window_s=10.0, max_batch=10, max_inflight=100)
    futs = [gc.stage("meta", f"b{i}".encode()) for i in range(35)]
    # 30 rows filled three batches at once; the last 5 wait (a batch is being written) for
    # those to be done, not for their 10 s window.
    assert gc.pending == 5
    await asyncio.wait_for(asyncio.gather(*futs), 5)
    assert all(f.exception() is None for f in futs)
    assert await pool.fetchval("SELECT count(*) FROM webhook_inbox") == 35
    assert gc.batches_written == 4
    assert await pool.fetchval("SELECT count(DISTINCT xmin::text) FROM webhook_inbox") == 4
    await gc.close()


async def test_idle_database_writes_at_once(pool: asyncpg.Pool, db_dsn: str) -> None:
    """Nothing being written: the rows staged in one pass of the event loop go at its end, as
    one batch, without waiting for the window."""
    gc = GroupCommitter(partial(connect, db_dsn), window_s=60.0, max_batch=1000)
    futs = [gc.stage("meta", f"idle{i}".encode()) for i in range(3)]
    await asyncio.wait_for(asyncio.gather(*futs), 5)
    assert gc.batches_written == 1
    # The next row finds nothing in flight either.
    await asyncio.wait_for(gc.stage("meta", b"later"), 5)
    assert gc.batches_written == 2
    await gc.close()


@pytest.mark.parametrize(
    ("rate", "linger_s", "gather", "gap_s", "batches"),
    [
        # 10 rows/s: a 20 ms linger would likely bring nobody, so the first goes at once
        (10, 0.02, 4, 0.001, 2),
        # 500 rows/s: the first waits (8 ms: four more at that rate) and the next joins it
        (500, 0.02, 4, 0.001, 1),
        # GATEWAY_COMMIT_LINGER_GATHER bounds the wait, however long GATEWAY_COMMIT_LINGER_MS
        # allows. 100 rows/s: one more takes 10 ms; the first has gone when the second comes
        (100, 0.5, 1, 0.1, 2),
        # twenty more take 200 ms (under the 500 ms most): the second joins the first
        (100, 0.5, 20, 0.1, 1),
    ],
)
async def test_an_idle_committer_lingers_only_when_the_rate_brings_company(
    pool: asyncpg.Pool, db_dsn: str, rate: int, linger_s: float, gather: int, gap_s: float, batches: int
) -> None:
    """At a few hundred webhooks a second each would be its own transaction (COMMIT, WAL
    flush, NOTIFY); the recent rate decides whether a lone row waits for others, and for how
    many (the time that rate takes to bring ``gather`` more, at most ``linger_s``)."""
    gc = GroupCommitter(
        partial(connect, db_dsn), window_s=60.0, max_batch=1000, linger_s=linger_s, linger_gather=gather
    )
    gc._rate.counted(asyncio.get_running_loop().time(), rate)  # as a second of such traffic leaves it
    first = gc.stage("meta", b"first")
    await asyncio.sleep(gap_s)
    second = gc.stage("meta", b"second")
    await asyncio.wait_for(asyncio.gather(first, second), 5)
    assert gc.batches_written == batches
    await gc.close()


@pytest.mark.parametrize(
    ("client", "batches"),
    [
        (1, 3),  # the warm-up's connection again, and nobody else lately: it goes at once
        (2, 2),  # another connection: it lingers (8 ms at 500/s) and the next row joins it
    ],
)
async def test_a_lone_client_never_waits_for_itself(
    pool: asyncpg.Pool, db_dsn: str, client: int, batches: int
) -> None:
    """A client that sends one webhook at a time on one connection cannot bring another while
    it waits for its answer: its rows linger only while other connections send too."""
    gc = GroupCommitter(partial(connect, db_dsn), window_s=60.0, max_batch=1000, linger_s=0.02, others_s=0.05)
    loop = asyncio.get_running_loop()
    await gc.stage("meta", b"warm-up", client=1)
    await asyncio.sleep(0.1)  # longer than others_s: connection 1 has been alone since
    gc._rate.counted(loop.time(), 500)  # as a busy second leaves it
    row = gc.stage("meta", b"row", client=client)
    await asyncio.sleep(0.001)
    after = gc.stage("meta", b"after", client=1)
    await asyncio.wait_for(asyncio.gather(row, after), 5)
    assert gc.batches_written == batches
    await gc.close()


async def test_rows_staged_during_a_write_wait_for_it(pool: asyncpg.Pool, db_dsn: str) -> None:
    """While a batch is being written, new rows wait for it (not for their window) and then
    go together as one batch."""
    gc = GroupCommitter(partial(connect, db_dsn), window_s=60.0, max_batch=1000, max_inflight=4)
    async with pool.acquire() as blocker, blocker.transaction():
        await blocker.execute("LOCK TABLE webhook_inbox IN ACCESS EXCLUSIVE MODE")
        first = gc.stage("meta", b"first")
        await asyncio.sleep(0.05)  # the first batch is being written (stuck on the lock)
        rest = [gc.stage("meta", b"rest") for _ in range(20)]
        await asyncio.sleep(0.05)
        assert gc.pending == 20 and gc.batches_written == 0
    await asyncio.wait_for(asyncio.gather(first, *rest), 5)
    assert gc.batches_written == 2
    await gc.close()


async def test_rows_staged_during_a_write_keep_their_linger_after_it(pool: asyncpg.Pool, db_dsn: str) -> None:
    """A row that arrived while a batch was being written does not go alone the moment that
    batch commits: it waits out its linger, from its own arrival, and a row arriving meanwhile
    joins it (sent at once, every other batch at a few hundred rows a second was one row)."""
    gc = GroupCommitter(
        partial(connect, db_dsn), window_s=60.0, max_batch=1000, linger_s=0.3, linger_gather=2
    )
    loop = asyncio.get_running_loop()
    gc._rate.counted(loop.time(), 10)  # 10 rows/s: a lone row lingers 0.2 s (two more at that rate)
    async with pool.acquire() as blocker, blocker.transaction():
        await blocker.execute("LOCK TABLE webhook_inbox IN ACCESS EXCLUSIVE MODE")
        first = gc.stage("meta", b"first")
        await asyncio.sleep(0.25)  # its linger is over: it is being written, stuck on the lock
        during = gc.stage("meta", b"during")
        staged = loop.time()
    await asyncio.wait_for(first, 5)
    assert not during.done() and gc.pending == 1  # the first batch committed; "during" lingers
    after = gc.stage("meta", b"after")
    await asyncio.wait_for(asyncio.gather(during, after), 5)
    assert loop.time() - staged >= 0.2
    rows = await pool.fetch("SELECT body, xmin::text AS tx FROM webhook_inbox ORDER BY id")
    assert [bytes(r["body"]) for r in rows] == [b"first", b"during", b"after"]
    assert rows[1]["tx"] == rows[2]["tx"] != rows[0]["tx"]
    assert gc.batches_written == 2
    await gc.close()


async def test_window_starts_a_parallel_batch(pool: asyncpg.Pool, db_dsn: str) -> None:
    """Rows that waited a window for a slow write go as a batch of their own."""
    gc = GroupCommitter(partial(connect, db_dsn), window_s=0.02, max_batch=1000, max_inflight=4)
    async with pool.acquire() as blocker, blocker.transaction():
        await blocker.execute("LOCK TABLE webhook_inbox IN ACCESS EXCLUSIVE MODE")
        first = gc.stage("meta", b"first")
        await asyncio.sleep(0.05)
        second = gc.stage("meta", b"second")
        await asyncio.sleep(0.1)  # past the window: a second batch is being written too
        assert gc.pending == 0
    await asyncio.wait_for(asyncio.gather(first, second), 5)
    assert gc.batches_written == 2
    await gc.close()


async def test_window_flushes_a_partial_batch(pool: asyncpg.Pool, db_dsn: str) -> None:
    gc = GroupCommitter(partial(connect, db_dsn), window_s=0.01, max_batch=1000)
    futs = [gc.stage("tenashi", b"x", f"evt_{i}") for i in range(3)]
    await asyncio.wait_for(asyncio.gather(*futs), 5)
    rows = await pool.fetch("SELECT delivery_id FROM webhook_inbox ORDER BY id")
    assert [r["delivery_id"] for r in rows] == ["evt_0", "evt_1", "evt_2"]  # arrival order
    await gc.close()


async def test_close_drains_pending_and_refuses_new_rows(pool: asyncpg.Pool, db_dsn: str) -> None:
    gc = GroupCommitter(partial(connect, db_dsn), window_s=60.0, max_batch=1000)
    futs = [gc.stage("meta", b"pending") for _ in range(50)]
    await gc.close()
    assert all(f.done() and not f.exception() for f in futs)
    assert await pool.fetchval("SELECT count(*) FROM webhook_inbox") == 50
    with pytest.raises(Unavailable):
        gc.stage("meta", b"late")


async def test_failed_batch_fails_every_row_in_it(pool: asyncpg.Pool, db_dsn: str) -> None:
    gc = GroupCommitter(partial(connect, db_dsn), window_s=0.001, max_batch=100)
    # 'sms' violates the source CHECK: the whole batch fails, and nobody gets a 200.
    futs = [gc.stage("meta", b"ok"), gc.stage("sms", b"bad")]
    results = await asyncio.gather(*futs, return_exceptions=True)
    assert all(isinstance(r, Unavailable) for r in results)
    assert await pool.fetchval("SELECT count(*) FROM webhook_inbox") == 0
    await gc.close()


async def test_inflight_limit_grows_the_next_batch(pool: asyncpg.Pool, db_dsn: str) -> None:
    gc = GroupCommitter(partial(connect, db_dsn), window_s=0.0, max_batch=1000, max_inflight=1)
    async with pool.acquire() as blocker, blocker.transaction():
        await blocker.execute("LOCK TABLE webhook_inbox IN ACCESS EXCLUSIVE MODE")
        first = gc.stage("meta", b"first")
        await asyncio.sleep(0.05)  # the first batch is now stuck on the lock
        rest = [gc.stage("meta", b"rest") for _ in range(20)]
        await asyncio.sleep(0.05)
    await asyncio.wait_for(asyncio.gather(first, *rest), 5)
    assert gc.batches_written == 2
    await gc.close()


async def test_rows_waiting_for_a_slot_fail_at_their_deadline(pool: asyncpg.Pool, db_dsn: str) -> None:
    gc = GroupCommitter(
        partial(connect, db_dsn), window_s=0.0, max_batch=1000, max_inflight=1, deadline_s=0.2
    )
    async with pool.acquire() as blocker, blocker.transaction():
        await blocker.execute("LOCK TABLE webhook_inbox IN ACCESS EXCLUSIVE MODE")
        stuck = gc.stage("meta", b"stuck")  # its batch blocks on the lock
        await asyncio.sleep(0.05)
        waiting = gc.stage("meta", b"waiting")  # no free slot
        results = await asyncio.wait_for(asyncio.gather(stuck, waiting, return_exceptions=True), 2)
    assert [type(r) for r in results] == [Unavailable, Unavailable]
    assert [r.reason for r in results if isinstance(r, Unavailable)] == ["timeout", "timeout"]
    await gc.close()


async def test_each_batch_takes_the_next_lane_and_a_failed_lane_rests(
    pool: asyncpg.Pool, db_dsn: str
) -> None:
    """A batch is staged in one lane (one shard's insert on Citus), the next batch in the next
    lane; a lane whose batch failed is passed over for a while (a Citus worker that is down
    fails only the batches of its lanes)."""
    gc = GroupCommitter(partial(connect, db_dsn), window_s=60.0, max_batch=1000)
    for i in range(3):
        await asyncio.wait_for(asyncio.gather(*(gc.stage("meta", f"l{i}.{j}".encode()) for j in range(4))), 5)
    rows = await pool.fetch(
        "SELECT array_agg(DISTINCT lane) AS lanes FROM webhook_inbox GROUP BY xmin::text ORDER BY min(id)"
    )
    assert len(rows) == 3 and all(len(r["lanes"]) == 1 for r in rows)
    lanes = [r["lanes"][0] for r in rows]
    assert lanes[1] == (lanes[0] + 1) % 32 and lanes[2] == (lanes[1] + 1) % 32
    # the lane after the last one failed: it is skipped until its rest is over
    failing = (gc._lane + 1) % groupcommit.LANES
    gc._resting[failing] = time.monotonic() + 60
    await asyncio.wait_for(gc.stage("meta", b"after"), 5)
    assert await pool.fetchval("SELECT lane FROM webhook_inbox WHERE body = 'after'") == (failing + 1) % 32
    await gc.close()


@pytest.mark.parametrize(
    ("warning", "answered"),
    [
        ("a warning that means nothing", True),
        # Citus's, when a worker's COMMIT got no answer (tests/citus/test_commit_doubt.py)
        ("failed to commit transaction on 10.0.0.7:5432", False),
    ],
)
async def test_a_batch_whose_commit_was_warned_about_is_not_acknowledged(
    pool: asyncpg.Pool, db_dsn: str, warning: str, answered: bool
) -> None:
    """A trigger's WARNING stands in for a Citus coordinator's (gateway.store.doubt): one saying
    a participant's COMMIT failed fails the batch (503), as a connection lost during COMMIT
    does; any other warning fails nothing."""
    await pool.execute(
        "CREATE FUNCTION probe_warn() RETURNS trigger LANGUAGE plpgsql AS "
        f"$$ BEGIN RAISE WARNING '{warning}'; RETURN NULL; END $$"
    )
    await pool.execute(
        "CREATE TRIGGER probe AFTER INSERT ON webhook_inbox FOR EACH STATEMENT EXECUTE FUNCTION probe_warn()"
    )
    gc = GroupCommitter(partial(connect, db_dsn), window_s=0.001)
    try:
        futs = [gc.stage("meta", b"warned%d" % i) for i in range(3)]
        done = await asyncio.wait_for(asyncio.gather(*futs, return_exceptions=True), 5)
        if answered:
            assert done == [None] * 3
        else:
            assert all(isinstance(r, Unavailable) for r in done), done
        # The next batch is judged by its own notices.
        await pool.execute("DROP TRIGGER probe ON webhook_inbox")
        await asyncio.wait_for(gc.stage("meta", b"after"), 5)
    finally:
        await gc.close()
        await pool.execute("DROP TRIGGER IF EXISTS probe ON webhook_inbox; DROP FUNCTION probe_warn()")
