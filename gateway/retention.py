"""Retention: old dedup keys, processed staging rows and status history, purged in bounded batches.

Each DELETE removes at most ``purge_batch`` rows in its own short transaction and the
loop repeats until a batch comes back short, so no lock is ever held for long and
consumers and ingest keep running alongside. Dead rows are never purged: an operator
replays or inspects them.
"""

from __future__ import annotations

import asyncio
import logging

import asyncpg

from gateway import metrics
from gateway.settings import Settings
from gateway.sqlfiles import q

log = logging.getLogger(__name__)


def _deleted(tag: str) -> int:
    """Rows affected, from a command tag such as ``DELETE 5000``."""
    return int(tag.rsplit(" ", 1)[-1])


async def purge_table(
    pool: asyncpg.Pool, query: str, days: int, batch: int, stop: asyncio.Event | None = None
) -> int:
    total = 0
    while stop is None or not stop.is_set():
        n = _deleted(await pool.execute(q(query), days, batch))
        total += n
        if n < batch:
            break
        await asyncio.sleep(0)  # let the consumers in between batches
    return total


async def purge(pool: asyncpg.Pool, settings: Settings, stop: asyncio.Event | None = None) -> dict[str, int]:
    """One retention pass over every table; returns rows deleted per table."""
    plan = (
        ("processed_webhook_events", "purge_processed_keys", settings.dedup_retention_days),
        ("webhook_inbox", "purge_done_inbox", settings.inbox_retention_days),
        ("message_statuses", "purge_message_statuses", settings.status_retention_days),
    )
    out: dict[str, int] = {}
    for table, query, days in plan:
        n = await purge_table(pool, query, days, settings.purge_batch, stop)
        out[table] = n
        if n:
            metrics.RETENTION_PURGED.labels(table).inc(n)
            log.info("retention: purged %d rows from %s (older than %d days)", n, table, days)
    return out
