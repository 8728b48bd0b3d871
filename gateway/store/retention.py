"""Retention and partitions: day partitions created ahead and dropped past their horizon,
bounded DELETE batches for the row sets that are not partitioned, and the advisory lock
that lets one replica at a time do it."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from datetime import date, datetime

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from gateway.store.db import Conn
from gateway.store.idempotency import affected
from gateway.store.sqlfiles import q

# Arbitrary but fixed: one maintenance pass at a time across every replica.
MAINTENANCE_LOCK_ID = 0x6777_7061_7274  # "gwpart"

# One connection (the advisory lock is held by its session): plain or from a pool.
Session = asyncpg.Connection | PoolConnectionProxy

# table -> the query that trims it in bounded batches ($1 days, $2 batch)
PURGES = {
    "processed_webhook_events": "processed_webhook_events_purge_untimed",
    "reply_claims": "reply_claims_purge",
    "outbox": "outbox_purge_terminal",
    "delivery_queue": "delivery_queue_purge_orphans",
    "dead_events": "dead_events_purge_done",
    "inbox_parked": "inbox_parked_purge_done",
    "event_fragments": "event_fragments_purge",
    "media": "media_purge",
}


async def try_lock(conn: Session) -> bool:
    """Session advisory lock on this connection; False when another replica holds it."""
    return bool(await conn.fetchval(q("maintenance_try_lock"), MAINTENANCE_LOCK_ID))


async def unlock(conn: Session) -> None:
    await conn.fetchval(q("maintenance_unlock"), MAINTENANCE_LOCK_ID)


async def ensure_day(conn: Session, *, table: str, day: date) -> bool:
    """Create ``table``'s partition for ``day``; False if it existed."""
    async with conn.transaction():
        await conn.execute(q("partition_lock_timeout"))
        return bool(await conn.fetchval(q("partition_ensure_day"), table, day))


async def ensure_today(conn: Session, *, table: str) -> bool:
    """Today's (and tomorrow's) day partition of ``table``, made now if missing (False: they
    existed), in a transaction of its own on ``conn`` that never waits long for a lock."""
    async with conn.transaction():
        await conn.execute(q("partition_lock_timeout"))
        return bool(await conn.fetchval(q("partition_ensure_today"), table))


async def days(conn: Conn, *, table: str) -> list[date]:
    """The days of ``table``'s day partitions, oldest first."""
    return [r[0] for r in await conn.fetch(q("partition_days"), table)]


_TABLE_NAME = re.compile(r"[a-z_]+(_p[0-9]{8})?")


def _ddl(query: str, **names: str) -> str:
    """A DDL statement of retention.sql with its table names filled in (checked, never input)."""
    for name in names.values():
        if not _TABLE_NAME.fullmatch(name):
            raise ValueError(f"not a partition name: {name!r}")
    return q(query).format(**names)


async def has_default(conn: Conn, *, table: str) -> bool:
    """Whether ``table`` has a default partition (rows of days without one land there)."""
    return bool(await conn.fetchval(q("partition_has_default"), table))


async def blocker(conn: Conn, *, table: str, held_s: float) -> tuple[int, datetime] | None:
    """A transaction that has held a lock on ``table`` for more than ``held_s``: (pid, since)."""
    r = await conn.fetchrow(q("partition_blocker"), table, held_s)
    return None if r is None or r["pid"] is None else (r["pid"], r["since"])


async def drop_oldest(conn: Session, *, table: str, before: date, keep_days: int) -> str | None:
    """Drop ``table``'s oldest day partition older than ``before``; its name or None.

    Without a default partition: DETACH ... CONCURRENTLY (outside a transaction) then DROP of
    the detached table: neither takes a lock on the parent that would stop inserts or claims;
    a detach interrupted by a crash or a lock timeout is finalized on the next call. With one
    (processed_webhook_events): a plain DETACH, the keys processed within ``keep_days`` moved to
    the default partition, and the DROP, in one short transaction. On Citus (the extension in
    the database), a plain DETACH and the DROP in one short transaction. Every wait is bounded
    by lock_timeout (LockNotAvailableError: try again on the next pass).
    """
    r = await conn.fetchrow(q("partition_oldest_before"), table, before)
    if r is None or r["name"] is None:
        return None
    name: str = r["name"]
    if await has_default(conn, table=table):
        async with conn.transaction():
            await conn.execute(q("partition_lock_timeout"))
            await conn.execute(_ddl("partition_detach_now", parent=table, child=name))
            await conn.execute(_ddl("partition_carry_recent_keys", child=name), keep_days)
            await conn.execute(_ddl("partition_drop_detached", child=name))
        return name
    if await conn.fetchval(q("citus_installed")):
        # Citus refuses DETACH ... CONCURRENTLY on a distributed table: a plain DETACH (the
        # parent's lock for the catalog change on every node, bounded by lock_timeout) and the
        # DROP, in one short transaction; Citus runs both on every shard.
        async with conn.transaction():
            await conn.execute(q("partition_lock_timeout"))
            await conn.execute(_ddl("partition_detach_now", parent=table, child=name))
            await conn.execute(_ddl("partition_drop_detached", child=name))
        return name
    await conn.execute(q("partition_session_lock_timeout"))
    try:
        if r["detach_pending"]:
            await conn.execute(_ddl("partition_detach_finalize", parent=table, child=name))
        else:
            await conn.execute(_ddl("partition_detach", parent=table, child=name))
    finally:
        await conn.execute(q("partition_session_lock_timeout_reset"))
    async with conn.transaction():
        await conn.execute(q("partition_lock_timeout"))
        await conn.execute(_ddl("partition_drop_detached", child=name))
    return name


@contextlib.asynccontextmanager
async def bodies_locked(conn: Session) -> AsyncIterator[None]:
    """While held, nothing refers to stored delivery bodies again (replays of delivered
    deliveries wait): old days of delivery_events can be carried forward and dropped."""
    await conn.execute(q("deliveries_bodies_lock"))
    try:
        yield
    finally:
        await conn.execute(q("deliveries_bodies_unlock"))


async def delivery_events_carry_forward(conn: Conn, *, before: date) -> int:
    """Events stored before ``before`` that open deliveries still need move to today; how many."""
    r = await conn.fetchrow(q("delivery_events_carry_forward"), before)
    assert r is not None
    return int(r["events"])


async def inbox_carry_forward(conn: Conn, *, before: datetime) -> int:
    """Move rows not done out of the partitions about to be dropped; rows moved."""
    return affected(await conn.execute(q("inbox_carry_forward"), before))


async def purge_table(
    conn: Conn, *, table: str, older_than_days: int, batch: int, stop: asyncio.Event | None = None
) -> int:
    """Delete rows of ``table`` older than the horizon, batch by batch until a batch is short."""
    total = 0
    while stop is None or not stop.is_set():
        n = affected(await conn.execute(q(PURGES[table]), older_than_days, batch))
        total += n
        if n < batch:
            break
        await asyncio.sleep(0)  # let the consumers in between batches
    return total
