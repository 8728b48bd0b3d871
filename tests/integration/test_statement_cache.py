"""The consumers' batch statement is prepared once per connection and its plan kept: a query
text longer than asyncpg's statement cache takes (15 KiB by default) would be parsed and
planned again at every batch (~2 ms of PostgreSQL's time each)."""

from __future__ import annotations

from gateway.core.settings import Settings
from gateway.inbound.consumer import Consumer
from gateway.store.db import create_pool
from gateway.store.sqlfiles import q
from gateway.testing.payloads import message_obj, messages_payload, to_bytes
from tests.support.consume import stage

BATCHES = 8


async def test_the_batch_statement_is_planned_once_per_connection(db_dsn: str, settings: Settings) -> None:
    statement = q("inbox_apply_batch")
    assert len(statement) > 15 * 1024  # what asyncpg's default cache would not keep
    pool = await create_pool(db_dsn, 1, 1)
    try:
        consumer = Consumer(pool, settings)
        for i in range(BATCHES):
            await stage(pool, to_bytes(messages_payload(message_obj(f"wamid.P{i}", "hi"))))
            assert await consumer.step() == 1
        row = await pool.fetchrow(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement = $1", statement
        )
    finally:
        await pool.close()
    assert row is not None, "the batch statement is not kept prepared"
    assert row["generic_plans"] + row["custom_plans"] >= BATCHES
