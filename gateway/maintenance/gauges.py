"""Database-derived gauges: inbox depth and consumer lag, outbox states and unknown age,
forwarding backlog and breakers."""

from __future__ import annotations

import contextlib
import time

import asyncpg

from gateway import metrics
from gateway.core.enums import OutboxState
from gateway.core.forwarding import BREAKER_GAUGE, BreakerState
from gateway.store import deliveries, inbox, outbox, pacing


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
    for b in await pacing.list_breakers(pool):
        metrics.BREAKER_STATE.labels(b["scope"], b["provider"], b["key"]).set(BREAKER_LEVEL[b["state"]])


BREAKER_LEVEL = {"closed": 0, "half_open": 1, "open": 2}


_destinations: set[str] = set()


async def refresh_forward(pool: asyncpg.Pool) -> None:
    """Backlog, oldest due delivery and breaker state per destination; a removed destination's
    series go away."""
    names = set()
    for g in await deliveries.gauges(pool):
        names.add(g.name)
        metrics.FORWARD_BACKLOG.labels(g.name).set(g.backlog)
        metrics.FORWARD_OLDEST_DUE.labels(g.name).set(g.oldest_due_s)
        metrics.FORWARD_BREAKER.labels(g.name).set(BREAKER_GAUGE[BreakerState(g.breaker_state)])
    for gone in _destinations - names:
        for gauge in (metrics.FORWARD_BACKLOG, metrics.FORWARD_OLDEST_DUE, metrics.FORWARD_BREAKER):
            with contextlib.suppress(KeyError):
                gauge.remove(gone)
    _destinations.clear()
    _destinations.update(names)
