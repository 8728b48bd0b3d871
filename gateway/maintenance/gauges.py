"""Database-derived gauges: inbox depth and consumer lag, outbox states and unknown age."""

from __future__ import annotations

import time

import asyncpg

from gateway import metrics
from gateway.core.enums import OutboxState
from gateway.store import inbox, outbox


async def refresh_inbox(pool: asyncpg.Pool) -> None:
    metrics.INBOX_DEPTH.set(await inbox.depth(pool))
    metrics.CONSUMER_LAG.set(await inbox.lag_seconds(pool))


async def refresh_outbox(pool: asyncpg.Pool, now: float | None = None) -> None:
    counts = await outbox.count_by_state(pool)
    for state in OutboxState:
        metrics.OUTBOX_ROWS.labels(state.value).set(counts.get(state, 0))
    oldest = await outbox.oldest_unknown(pool)
    now = time.time() if now is None else now
    metrics.OLDEST_UNKNOWN.set(max(0.0, now - oldest) if oldest is not None else 0.0)
