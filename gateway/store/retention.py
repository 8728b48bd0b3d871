"""Retention DELETEs: each removes at most ``batch`` rows in its own short transaction.

Dead rows, dead events and failed deliveries are never purged: an operator replays or inspects them.
"""

from __future__ import annotations

import asyncio

from gateway.store.db import Conn
from gateway.store.idempotency import affected
from gateway.store.sqlfiles import q

# table -> the query that trims it
QUERIES = {
    "processed_webhook_events": "processed_webhook_events_purge",
    "webhook_inbox": "inbox_purge_done",
    "message_statuses": "message_statuses_purge",
    "deliveries": "deliveries_purge_delivered",
    "dead_events": "dead_events_purge_done",
}


async def purge_table(
    conn: Conn, *, table: str, older_than_days: int, batch: int, stop: asyncio.Event | None = None
) -> int:
    """Delete rows of ``table`` older than the horizon, batch by batch until a batch is short."""
    total = 0
    while stop is None or not stop.is_set():
        n = affected(await conn.execute(q(QUERIES[table]), older_than_days, batch))
        total += n
        if n < batch:
            break
        await asyncio.sleep(0)  # let the consumers in between batches
    return total
