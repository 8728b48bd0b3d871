"""The consumers' claim bound (inbox.due_from): claims start past the index entries that done
rows leave dead at the head of webhook_inbox_due until a vacuum, and no pending row is lost."""

from __future__ import annotations

import asyncio
import json

import asyncpg

from gateway.core.settings import Settings
from gateway.inbound.consumer_group import ConsumerGroup
from gateway.runtime import services
from gateway.store import inbox
from gateway.store.sqlfiles import q
from gateway.testing.payloads import message_obj, messages_payload, to_bytes
from tests.support.config import replace

BODY = to_bytes(messages_payload(message_obj("wamid.bound", text="x")))


async def _claim_blocks(conn: asyncpg.Connection, due_from: object) -> int:
    """Shared buffers one claim of 10 rows touches (EXPLAIN ANALYZE; its locks end with it)."""
    async with conn.transaction():
        plan = await conn.fetchval(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + q("inbox_claim_batch"), 10, 1 << 20, due_from
        )
    doc = json.loads(plan) if isinstance(plan, str) else plan
    return int(doc[0]["Plan"]["Shared Hit Blocks"]) + int(doc[0]["Plan"].get("Shared Read Blocks", 0))


async def _stage(pool: asyncpg.Pool, n: int, age_s: float = 0.0) -> None:
    await pool.execute(
        "INSERT INTO webhook_inbox (source, body, next_attempt_at) "
        "SELECT 'meta', $1, clock_timestamp() - make_interval(secs => $3) FROM generate_series(1, $2)",
        BODY,
        n,
        age_s,
    )


async def test_claims_start_past_the_dead_head(pool: asyncpg.Pool) -> None:
    for part in await pool.fetch(
        "SELECT inhrelid::regclass::text AS t FROM pg_inherits WHERE inhparent = 'webhook_inbox'::regclass"
    ):
        await pool.execute(f"ALTER TABLE {part['t']} SET (autovacuum_enabled = off)")
    await _stage(pool, 20000, age_s=60)  # received a minute ago
    # Done as consumers mark them: each leaves its entry dead at the head of the due index.
    await pool.execute("UPDATE webhook_inbox SET state = 'done'")
    await _stage(pool, 10)
    async with pool.acquire() as conn:
        bound = await inbox.due_from(conn)
        from_head = await _claim_blocks(conn, None)
        from_bound = await _claim_blocks(conn, bound)
        async with conn.transaction():
            rows, _ = await inbox.claim_batch(conn, limit=100, max_bytes=1 << 20, due_from=bound)
    assert len(rows) == 10  # every pending row, none lost
    # The dead entries of 20 000 rows fill scores of index pages that only the scan from the
    # head reads (both read the same pages for the 10 rows they lock).
    assert from_head - from_bound >= 50, (from_head, from_bound)


async def test_a_row_below_the_bound_waits_for_the_next_reading(pool: asyncpg.Pool) -> None:
    """A row committed with a next_attempt_at older than the bound (an insert whose transaction
    took longer than a second to commit) is not claimed with that bound; the next reading of
    the bound takes it in."""
    await pool.execute("INSERT INTO webhook_inbox (source, body) VALUES ('meta', $1)", BODY)
    bound = await inbox.due_from(pool)
    late = await pool.fetchval(
        "INSERT INTO webhook_inbox (source, body, next_attempt_at) "
        "VALUES ('meta', $1, clock_timestamp() - interval '1 hour') RETURNING id",
        BODY,
    )
    async with pool.acquire() as conn, conn.transaction():
        rows, _ = await inbox.claim_batch(conn, limit=100, max_bytes=1 << 20, due_from=bound)
        assert late not in {r.id for r in rows}
    again = await inbox.due_from(pool)
    async with pool.acquire() as conn, conn.transaction():
        rows, _ = await inbox.claim_batch(conn, limit=100, max_bytes=1 << 20, due_from=again)
        assert late in {r.id for r in rows}


async def test_a_group_reads_its_bound_and_its_consumers_use_it(
    pool: asyncpg.Pool, settings: Settings
) -> None:
    group = ConsumerGroup(pool, replace(settings, consumer_concurrency=2, consumer_poll_ms=50))
    assert group.due.at is None and all(c._due is group.due for c in group.consumers)
    await pool.execute("INSERT INTO webhook_inbox (source, body) VALUES ('meta', $1)", BODY)
    async with services.running(group):
        for _ in range(100):
            if group.due.at is not None and not await pool.fetchval(
                "SELECT count(*) FROM webhook_inbox WHERE state = 'pending'"
            ):
                break
            await asyncio.sleep(0.05)
    assert group.due.at is not None
    assert await pool.fetchval("SELECT count(*) FROM webhook_inbox WHERE state = 'done'") == 1
