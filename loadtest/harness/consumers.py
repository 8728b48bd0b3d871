"""The production consumers draining a staged backlog: a ``ConsumerGroup`` (its lanes, its
loops) run until nothing is left to read, for the benchmarks that time consumption."""

from __future__ import annotations

import asyncio
import contextlib

import asyncpg

from gateway.core.settings import Settings
from gateway.inbound.consumer_group import ConsumerGroup
from loadtest.harness.sql import q

# How often the drain looks whether anything is left.
POLL_S = 0.02


async def drain(pool: asyncpg.Pool, settings: Settings) -> None:
    """Run a consumer group over ``settings.database_url`` until every staged row is read and
    no webhook moved aside waits for a retry."""
    group = ConsumerGroup(pool, settings)
    stop = asyncio.Event()
    task = asyncio.create_task(group.run(stop))
    try:
        while not task.done():
            left = await pool.fetchval(q("drain_left"))
            if not left:
                break
            await asyncio.sleep(POLL_S)
    finally:
        stop.set()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await group.close()
