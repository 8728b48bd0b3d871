"""The inbox as a log read by lanes: commit order, ownership, takeover and fencing, against a
real PostgreSQL."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from gateway.core.faults import FENCED
from gateway.core.lanes import LANES, LaneSet, advance
from gateway.core.planning import plan_batch
from gateway.core.settings import Settings
from gateway.inbound.lanes import LaneLease
from gateway.store import inbox
from gateway.store import lanes as lanes_store
from gateway.store.db import connect
from gateway.store.sqlfiles import q
from gateway.testing.payloads import message_obj, messages_payload, to_bytes
from tests.support.config import replace
from tests.support.consume import counts, drain, inbox_states, leased, stage

STAGE = "INSERT INTO webhook_inbox (source, body) VALUES ('meta', $1) RETURNING id"


def body(n: int | str) -> bytes:
    return to_bytes(messages_payload(message_obj(f"wamid.L{n}")))


async def lease(conn: asyncpg.Connection | asyncpg.Pool, settings: Settings) -> tuple[LaneSet, LaneLease]:
    lanes = LaneSet()
    held = LaneLease(settings, lanes)
    await held.refresh(conn)
    return lanes, held


async def test_a_row_that_commits_late_with_a_smaller_txid_is_read_later_not_skipped(
    pool: asyncpg.Pool, settings: Settings, db_dsn: str
) -> None:
    late = await connect(db_dsn)
    try:
        tx = late.transaction()
        await tx.start()
        late_id = await late.fetchval(STAGE, body("late"))  # its txid is the smaller one
        early_id = await stage(pool, body("early"))  # committed first
        consumer = await leased(pool, settings)
        assert await consumer.process_batch() == 1
        assert await pool.fetchval("SELECT count(*) FROM inbound_messages") == 1
        await tx.commit()
        assert await consumer.process_batch() == 1
        assert await consumer.process_batch() == 0
    finally:
        await late.close()
    rows = await pool.fetch("SELECT inbox_id FROM processed_webhook_events ORDER BY processed_at")
    assert [r["inbox_id"] for r in rows] == [early_id, late_id]
    assert await inbox_states(pool) == {"done": 2}


async def test_a_long_write_transaction_elsewhere_does_not_stall_the_cursors(
    pool: asyncpg.Pool, settings: Settings, db_dsn: str
) -> None:
    # A session holding a transaction id open (an operator's forgotten UPDATE): rows committed
    # after it began keep flowing, and the read does not walk them again and again.
    other = await connect(db_dsn)
    try:
        tx = other.transaction()
        await tx.start()
        await other.execute("CREATE TEMP TABLE held (x int)")
        await other.execute("INSERT INTO held VALUES (1)")
        consumer = await leased(pool, replace(settings, consumer_batch=50))
        for round_ in range(4):
            for i in range(40):
                await stage(pool, body(f"{round_}.{i}"))
            while await consumer.process_batch():
                pass
            assert await pool.fetchval("SELECT count(*) FROM inbound_messages") == 40 * (round_ + 1)
        # With everything read, a read finds nothing without walking the 160 rows read since.
        lanes = consumer._lanes
        cursors = [lanes.cursors[lane] for lane in lanes.owned()]
        plan = await _explain(pool, cursors)
        assert plan["rows"] == 0 and plan["heap"] < 20, plan
        await tx.rollback()
    finally:
        await other.close()


async def _explain(pool: asyncpg.Pool, cursors: list) -> dict[str, int]:  # type: ignore[type-arg]
    doc = await pool.fetchval(
        "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + q("inbox_read"),
        *inbox.read_args(cursors, limit=100, max_bytes=1 << 20),
    )
    plan = (json.loads(doc) if isinstance(doc, str) else doc)[0]["Plan"]
    return {"rows": int(plan["Actual Rows"]), "heap": int(plan.get("Shared Hit Blocks", 0))}


async def test_rows_stamped_with_a_stepped_clock_are_read_in_commit_order(
    pool: asyncpg.Pool, settings: Settings
) -> None:
    # A clock stepped back an hour, then forward two: the log is read by transaction, not by
    # time, so nothing is skipped or read twice.
    now = datetime.now(UTC)
    for i, at in enumerate((now, now - timedelta(hours=1), now + timedelta(hours=2), now)):
        await pool.execute(
            "INSERT INTO webhook_inbox (source, body, received_at) VALUES ('meta', $1, $2)", body(f"c{i}"), at
        )
    await drain(pool, settings)
    c = await counts(pool)
    assert (c["processed_webhook_events"], c["inbound_messages"]) == (4, 4)
    assert await inbox_states(pool) == {"done": 4}


async def test_two_members_split_the_lanes_and_never_own_one_together(
    pool: asyncpg.Pool, settings: Settings, db_dsn: str
) -> None:
    a_conn, b_conn = await connect(db_dsn), await connect(db_dsn)
    try:
        a, a_lease = await lease(a_conn, settings)
        assert sorted(a.cursors) == list(range(LANES))  # alone: every lane
        b, b_lease = await lease(b_conn, settings)
        assert not b.cursors  # a holds them all until its next renewal
        await a_lease.refresh(a_conn)  # a sees b and lets b's share go
        await b_lease.refresh(b_conn)
        assert len(a.cursors) == len(b.cursors) == LANES // 2
        assert not set(a.cursors) & set(b.cursors)
        owners = {r["owner"] for r in await lanes_store.state(pool)}
        assert owners == {a_lease.member, b_lease.member}
        # b stops: its lanes are free at once, and a takes them at its next renewal.
        await b_lease.leave(b_conn)
        await a_lease.refresh(a_conn)
        assert sorted(a.cursors) == list(range(LANES))
    finally:
        await a_conn.close()
        await b_conn.close()


async def test_a_dead_members_lanes_are_taken_at_once(
    pool: asyncpg.Pool, settings: Settings, db_dsn: str
) -> None:
    a_conn, b_conn = await connect(db_dsn), await connect(db_dsn)
    try:
        a, a_lease = await lease(a_conn, settings)
        b, b_lease = await lease(b_conn, settings)
        await a_lease.refresh(a_conn)
        await b_lease.refresh(b_conn)
        assert len(b.cursors) == LANES // 2
        b_conn.terminate()  # as a SIGKILL of b's process closes its connections
        await asyncio.sleep(0.2)  # the server notices the closed socket
        await a_lease.refresh(a_conn)  # b is no longer live: its leases count for nothing
        assert sorted(a.cursors) == list(range(LANES))
    finally:
        await a_conn.close()


async def test_a_hung_member_loses_its_lanes_and_its_late_batch_commits_nothing(
    pool: asyncpg.Pool, settings: Settings, db_dsn: str
) -> None:
    s = replace(settings, consumer_lane_lease_s=1.0)
    stuck_conn, other_conn = await connect(db_dsn), await connect(db_dsn)
    try:
        stuck, stuck_lease = await lease(stuck_conn, s)
        await stage(pool, body("hung"))
        # It reads a batch, then hangs (SIGSTOP) past its lease: its connection stays open.
        taken = stuck.take()
        batch = await inbox.read(stuck_conn, taken, limit=10, max_bytes=1 << 20)
        assert batch.snapshots and len(batch.rows) == 1
        last = batch.rows[-1]
        moved = advance(taken, batch.snapshots, (last.txid, last.id), batch.exhausted)
        await asyncio.sleep(1.2)
        other, other_lease = await lease(other_conn, s)
        assert sorted(other.cursors) == list(range(LANES))  # taken over
        from gateway.inbound.consumer import Consumer

        consumer = Consumer(pool, s, lanes=other, member=other_lease.member)
        assert await consumer.process_batch() == 1  # the new owner processes the row
        # The hung one wakes up and commits its batch: fenced, nothing of it stays.
        with pytest.raises(asyncpg.PostgresError) as caught:
            async with stuck_conn.transaction():
                await inbox.apply_plan(
                    stuck_conn,
                    plan_batch(batch.rows),
                    member=stuck_lease.member,
                    advance=inbox.advance_arg(taken, moved),
                )
        assert caught.value.sqlstate == FENCED
    finally:
        await stuck_conn.close()
        await other_conn.close()
    c = await counts(pool)
    assert (c["processed_webhook_events"], c["inbound_messages"]) == (1, 1)


async def test_a_cursor_moved_by_someone_else_fences_a_batch(pool: asyncpg.Pool, settings: Settings) -> None:
    await stage(pool, body("f"))
    lanes, held = await lease(pool, settings)
    taken = lanes.take()
    batch = await inbox.read(pool, taken, limit=10, max_bytes=1 << 20)
    assert batch.snapshots
    last = batch.rows[-1]
    moved = advance(taken, batch.snapshots, (last.txid, last.id), batch.exhausted)
    await pool.execute("UPDATE inbox_lanes SET version = version + 1 WHERE lane = $1", last.lane)
    with pytest.raises(asyncpg.PostgresError) as caught:
        async with pool.acquire() as conn, conn.transaction():
            await inbox.apply_plan(
                conn, plan_batch(batch.rows), member=held.member, advance=inbox.advance_arg(taken, moved)
            )
    assert caught.value.sqlstate == FENCED
    assert await pool.fetchval("SELECT count(*) FROM processed_webhook_events") == 0


async def test_a_group_of_consumers_reads_a_backlog_in_parallel_exactly_once(
    pool: asyncpg.Pool, settings: Settings
) -> None:
    ids = [await stage(pool, body(i)) for i in range(300)]
    ids += [await stage(pool, body(i)) for i in range(0, 300, 3)]  # redeliveries
    s = replace(settings, consumer_batch=20)
    lanes, held = await lease(pool, s)
    from gateway.inbound.consumer import Consumer

    consumers = [Consumer(pool, s, lanes=lanes, member=held.member, loops=3) for _ in range(3)]

    async def loop(c: Consumer) -> None:
        idle = 0
        while idle < 20:
            idle = 0 if await c.process_batch() else idle + 1
            await asyncio.sleep(0)

    await asyncio.gather(*(loop(c) for c in consumers))
    c = await counts(pool)
    assert (c["processed_webhook_events"], c["inbound_messages"]) == (300, 300)
    assert await inbox_states(pool) == {"done": len(ids)}
