"""Retention: old dedup keys, processed staging rows and status history, purged in bounded
batches so no lock is held for long and consumers and ingest keep running alongside."""

from __future__ import annotations

import asyncio
import logging

import asyncpg

from gateway import metrics
from gateway.core.settings import Settings
from gateway.store import retention

log = logging.getLogger(__name__)


async def purge(pool: asyncpg.Pool, settings: Settings, stop: asyncio.Event | None = None) -> dict[str, int]:
    """One retention pass over every table; returns rows deleted per table."""
    plan = (
        ("processed_webhook_events", settings.dedup_retention_days),
        ("webhook_inbox", settings.inbox_retention_days),
        ("message_statuses", settings.status_retention_days),
        ("deliveries", settings.delivery_retention_days),
        ("dead_events", settings.inbox_retention_days),  # only those a retry or replay finished
    )
    out: dict[str, int] = {}
    for table, days in plan:
        n = await retention.purge_table(
            pool, table=table, older_than_days=days, batch=settings.purge_batch, stop=stop
        )
        out[table] = n
        if n:
            metrics.RETENTION_PURGED.labels(table).inc(n)
            log.info("retention: purged %d rows from %s (older than %d days)", n, table, days)
    return out
