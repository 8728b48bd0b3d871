"""One process at a time: a session-level advisory lock held on a dedicated connection.

The lock lives in the server session: it goes with the connection (the holder's exit, a lost
connection, a failover, where the old primary's sessions are gone with it), and the next
process to reconnect, to the primary of the moment, takes it there."""

from __future__ import annotations

import asyncpg

from gateway.store.sqlfiles import q

# Arbitrary but fixed, distinct from the migration lock: the database-wide gauges' exporter.
GAUGE_LEADER_LOCK_ID = 0x6777_6761_7567_65  # "gwgauge"


async def try_lock(conn: asyncpg.Connection, *, lock_id: int) -> bool:
    """Take the lock for this connection's session; False when another session holds it."""
    got: bool = await conn.fetchval(q("leader_try_lock"), lock_id)
    return got
