"""The consumer's batches and its loop against a real PostgreSQL: what one claim takes, how
many statements a batch costs, when the loop claims again, and how a group's consumers are
woken (one idle consumer per NOTIFY, more for a backlog)."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest

from gateway.core.settings import Settings
from gateway.inbound.consumer import Consumer
from gateway.inbound.consumer_group import ConsumerGroup
from gateway.runtime import services
from gateway.store import inbox
from gateway.store.db import create_pool
from gateway.testing.payloads import (
    message_obj,
    messages_payload,
    meta_payload,
    meta_value,
    status_obj,
    to_bytes,
)
from tests.support.config import replace
from tests.support.consume import inbox_states, stage


async def test_batch_reads_bodies_up_to_a_byte_budget(pool: asyncpg.Pool, settings: Settings) -> None:
    bodies = [to_bytes(messages_payload(message_obj(f"wamid.B{i}", text="x" * 800))) for i in range(5)]
    for b in bodies:
        await stage(pool, b)
    size = len(bodies[0])
    consumer = Consumer(pool, replace(settings, consumer_batch=100, consumer_batch_bytes=2 * size + 10))
    assert [await consumer.process_batch() for _ in range(4)] == [2, 2, 1, 0]
    # A single row larger than the budget is still processed, alone.
    await stage(pool, to_bytes(messages_payload(message_obj("wamid.BIG", text="y" * 5000))))
    assert await consumer.process_batch() == 1
    assert await pool.fetchval("SELECT count(*) FROM inbound_messages") == 6


@pytest.mark.parametrize(
    ("limit", "budget_rows", "claimed", "more"),
    [
        (10, 10, 5, False),  # everything due fits: wait for the next wake-up
        (5, 10, 5, True),  # a full batch: more may be due
        (10, 2, 2, True),  # the byte budget left some of the locked rows
    ],
)
async def test_a_claim_says_whether_more_rows_are_due(
    pool: asyncpg.Pool, limit: int, budget_rows: int, claimed: int, more: bool
) -> None:
    bodies = [to_bytes(messages_payload(message_obj(f"wamid.M{i}", text="x" * 800))) for i in range(5)]
    for b in bodies:
        await stage(pool, b)
    async with pool.acquire() as conn, conn.transaction():
        rows, again = await inbox.claim_batch(conn, limit=limit, max_bytes=budget_rows * len(bodies[0]) + 10)
    assert (len(rows), again) == (claimed, more)


async def test_a_batch_costs_a_constant_number_of_statements(db_dsn: str, settings: Settings) -> None:

    pool = await create_pool(db_dsn, 1, 1)
    try:
        statements: list[str] = []
        async with pool.acquire() as conn:
            conn.add_query_logger(lambda rec: statements.append(rec.query))
        consumer = Consumer(pool, replace(settings, consumer_batch=1000))
        # The first batch also runs asyncpg's one-off type introspection: a warm-up.
        for warm_up, n_rows in ((True, 1), (False, 1), (False, 300)):
            for i in range(n_rows):
                sts = [status_obj(f"wamid.{n_rows}.{i}", s) for s in ("sent", "delivered", "read")]
                await pool.execute(
                    "INSERT INTO webhook_inbox (source, body) VALUES ('meta', $1)",
                    to_bytes(
                        meta_payload(
                            (
                                "messages",
                                meta_value(messages=[message_obj(f"wamid.m{n_rows}.{i}")], statuses=sts),
                            )
                        )
                    ),
                )
            statements.clear()
            assert await consumer.process_batch() == n_rows
            # BEGIN, claim, SAVEPOINT, apply_batch, COMMIT (which releases the savepoint) and
            # the pool's reset on release: the same six for 4 events and for 1200.
            if not warm_up:
                assert len(statements) == 6, [s[:60] for s in statements]
    finally:
        await pool.close()


async def test_after_a_batch_that_left_nothing_due_the_loop_waits(db_dsn: str, settings: Settings) -> None:
    # It used to claim again at once, find nothing, and look at dead items: eight round trips
    # per batch for nothing (half the batches under load). A NOTIFY during the batch, or the
    # poll, wakes it instead.

    pool = await create_pool(db_dsn, 1, 1)
    stop = asyncio.Event()
    try:
        claims: list[str] = []
        async with pool.acquire() as conn:
            conn.add_query_logger(
                lambda rec: claims.append(rec.query) if "FROM claimed) AS locked" in rec.query else None
            )
        await stage(pool, to_bytes(messages_payload(message_obj("wamid.W1"))))
        consumer = Consumer(pool, replace(settings, consumer_poll_ms=60_000))
        task = asyncio.create_task(consumer.run(stop))
        for _ in range(200):
            if await inbox_states(pool) == {"done": 1}:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)
        assert len(claims) == 1
        await stage(pool, to_bytes(messages_payload(message_obj("wamid.W2"))))
        consumer.wake.set()  # as a NOTIFY does
        for _ in range(200):
            if await inbox_states(pool) == {"done": 2}:
                break
            await asyncio.sleep(0.01)
        assert await inbox_states(pool) == {"done": 2} and len(claims) == 2
    finally:
        stop.set()
        consumer.wake.set()
        await task
        await pool.close()


def _counting(group: ConsumerGroup) -> list[list[int]]:
    """Each consumer's batches (rows claimed), as they happen."""
    seen: list[list[int]] = []
    for c in group.consumers:
        batches: list[int] = []
        seen.append(batches)

        async def counted(orig: Any = c.process_batch, batches: list[int] = batches) -> int:
            n: int = await orig()
            batches.append(n)
            return n

        c.process_batch = counted  # type: ignore[method-assign]
    return seen


async def _all_idle(group: ConsumerGroup, seen: list[list[int]]) -> None:
    """Wait until every consumer has had its first look and waits; forget those looks."""
    for _ in range(300):
        if all(c.idle for c in group.consumers):
            break
        await asyncio.sleep(0.01)
    for batches in seen:
        batches.clear()


async def test_a_notify_wakes_one_idle_consumer_and_a_backlog_wakes_more(
    pool: asyncpg.Pool, settings: Settings
) -> None:
    group = ConsumerGroup(
        pool, replace(settings, consumer_concurrency=3, consumer_batch=10, consumer_poll_ms=60_000)
    )
    seen = _counting(group)
    async with services.running(group):
        await _all_idle(group, seen)
        await stage(pool, to_bytes(messages_payload(message_obj("wamid.N1"))))  # one NOTIFY
        for _ in range(300):
            if await inbox_states(pool) == {"done": 1}:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)
        # One consumer claimed it; the others were not woken to claim nothing.
        assert sorted(b for batches in seen for b in batches) == [1]
        # 40 rows in one statement (one NOTIFY): each full batch wakes an idle sibling.
        bodies = [to_bytes(messages_payload(message_obj(f"wamid.N{i}"))) for i in range(2, 42)]
        await pool.execute(
            "INSERT INTO webhook_inbox (source, body) SELECT 'meta', b FROM unnest($1::bytea[]) b", bodies
        )
        for _ in range(500):
            if await inbox_states(pool) == {"done": 41}:
                break
            await asyncio.sleep(0.01)
        assert await inbox_states(pool) == {"done": 41}
        assert sum(1 for batches in seen if any(batches)) >= 2
