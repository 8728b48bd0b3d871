"""Keyless Graph-compatible rows of concurrent requests share one INSERT and one COMMIT on the
batcher's own connections, against a real PostgreSQL: each request gets its own row, a broken
connection fails only its batch, and a stopping batcher takes no more rows."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg
import pytest

from gateway.outbound.enqueue_batch import EnqueueBatcher
from gateway.store import outbox
from gateway.store.db import DB_ERRORS, connect


def _message(i: int) -> outbox.NewMessage:
    return outbox.NewMessage("acme", f"graph.{uuid.uuid4().hex}", "meta", "1111", f"49151{i:08d}",
                             {"type": "text", "text": {"body": f"n{i}"}}, notify_outcome=True)  # fmt: skip


async def test_concurrent_rows_share_statements_and_each_gets_its_own(
    pool: asyncpg.Pool, db_dsn: str
) -> None:
    commits: list[int] = []
    batcher = EnqueueBatcher(lambda: connect(db_dsn), lambda: commits.append(1))
    try:
        msgs = [_message(i) for i in range(60)]
        rows = await asyncio.gather(*(batcher.enqueue(m) for m in msgs))
    finally:
        await batcher.close()
    assert [(r["idem_key"], r["recipient"], r["payload"]) for r in rows] == [
        (m.key, m.recipient, m.payload) for m in msgs
    ]
    stored = await pool.fetch("SELECT id, idem_key, state, notify_outcome FROM outbox")
    assert {(r["id"], r["idem_key"]) for r in stored} == {(r["id"], r["idem_key"]) for r in rows}
    assert {(r["state"], r["notify_outcome"]) for r in stored} == {("pending", True)}
    assert batcher.batches < 10  # shared statements, not one per row
    assert len(commits) == batcher.batches  # the senders woken once per batch


async def test_a_broken_connection_costs_at_most_its_batch(pool: asyncpg.Pool, db_dsn: str) -> None:
    batcher = EnqueueBatcher(lambda: connect(db_dsn))
    try:
        await batcher.enqueue(_message(0))
        await pool.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            "   AND query LIKE 'INSERT INTO outbox%'"
        )
        await asyncio.sleep(0.2)
        msgs = [_message(i) for i in range(1, 4)]
        first = await asyncio.gather(*(batcher.enqueue(m) for m in msgs), return_exceptions=True)
        then = await batcher.enqueue(_message(9))  # a new connection
    finally:
        await batcher.close()
    failed = [m.key for m, r in zip(msgs, first, strict=True) if isinstance(r, BaseException)]
    assert all(isinstance(r, DB_ERRORS) for r in first if isinstance(r, BaseException))
    stored = {r["idem_key"] for r in await pool.fetch("SELECT idem_key FROM outbox")}
    assert then["idem_key"] in stored and not stored & set(failed)  # failed: not enqueued
    assert stored >= {m.key for m in msgs if m.key not in failed}


async def test_a_stopped_batcher_takes_no_rows(pool: asyncpg.Pool, db_dsn: str) -> None:
    batcher = EnqueueBatcher(lambda: connect(db_dsn))
    await batcher.close()
    with pytest.raises(ConnectionError):
        await batcher.enqueue(_message(0))
    assert await pool.fetchval("SELECT count(*) FROM outbox") == 0
