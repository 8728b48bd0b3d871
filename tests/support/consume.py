"""Helpers for the consumer tests: stage rows, drain the inbox, count side effects."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg

from gateway.core.lanes import LaneSet
from gateway.core.settings import Settings
from gateway.inbound.consumer import Consumer
from gateway.inbound.lanes import LaneLease
from gateway.store.sqlfiles import q

# Steps in a row that a drain waits out before it fails (each is a fault's backoff).
MAX_DEFERRALS = 5

STAGE_ONE = "INSERT INTO webhook_inbox (source, body, delivery_id) VALUES ($1, $2, $3) RETURNING id"


async def stage(pool: asyncpg.Pool, body: bytes, source: str = "meta", delivery_id: str | None = None) -> int:
    return await stage_on(pool, body, source, delivery_id)


async def stage_on(
    conn: asyncpg.Pool | asyncpg.Connection, body: bytes, source: str = "meta", delivery_id: str | None = None
) -> int:
    inbox_id: int = await conn.fetchval(STAGE_ONE, source, body, delivery_id)
    return inbox_id


async def drain(pool: asyncpg.Pool, settings: Settings, consumers: int = 1) -> None:
    """Process until no due row is left, with ``consumers`` concurrent consumers (each made on
    its own: it holds the lanes for one batch at a time). A step put off (a day whose partition
    it just made, a fault a probe confirmed) is waited out and read again, a few times at most."""
    workers = [Consumer(pool, settings) for _ in range(consumers)]

    async def loop(c: Consumer) -> None:
        deferrals = 0
        while await c.step() or c.deferred_s:
            if c.deferred_s:
                deferrals += 1
                assert deferrals <= MAX_DEFERRALS, f"put off {deferrals} times in a row"
                await asyncio.sleep(c.deferred_s)
                c.deferred_s = 0.0
            else:
                deferrals = 0

    await asyncio.gather(*(loop(c) for c in workers))


async def dead_row(conn: asyncpg.Pool | asyncpg.Connection, body: bytes, **cols: Any) -> int:
    """A staged webhook moved aside dead (as a body that is no payload is), with ``cols`` of
    webhook_inbox (received_at, ...) set."""
    names = ["source", "body", *cols]
    marks = ", ".join(f"${i + 1}" for i in range(len(names)))
    inbox_id: int = await conn.fetchval(
        f"INSERT INTO webhook_inbox ({', '.join(names)}) VALUES ({marks}) RETURNING id",
        "meta",
        body,
        *cols.values(),
    )
    await conn.execute(
        "INSERT INTO inbox_parked"
        " (inbox_id, received_at, source, delivery_id, body, state, attempts, last_error)"
        " SELECT id, received_at, source, delivery_id, body, 'dead', 1, 'NotJson: test'"
        " FROM webhook_inbox WHERE id = $1",
        inbox_id,
    )
    return inbox_id


async def read_all(conn: asyncpg.Pool | asyncpg.Connection) -> None:
    """Every lane's cursor past every row committed so far, as if consumers had read them (on
    Citus at the lane's head, on the shard that holds both)."""
    if await conn.fetchval(q("citus_installed")):
        assert await conn.fetchval(
            "SELECT bool_and(success)"
            " FROM run_command_on_colocated_placements('inbox_lanes', 'inbox_heads', $1)",
            "UPDATE %s l SET done_snap = ((h.seq + 1)::text || ':' || (h.seq + 1)::text || ':')::pg_snapshot,"
            " win_snap = NULL, pos_txid = NULL, pos_id = NULL, version = l.version + 1"
            " FROM %s h WHERE h.lane = l.lane",
        )
        return
    await conn.execute(
        "UPDATE inbox_lanes SET done_snap = pg_current_snapshot(), win_snap = NULL, pos_txid = NULL,"
        " pos_id = NULL, version = version + 1"
    )


async def leased(pool: asyncpg.Pool, settings: Settings, **kw: Any) -> Consumer:
    """A consumer as a group makes one: the lanes leased once for its member (for the lease's
    length, GATEWAY_CONSUMER_LANE_LEASE_S), and held between batches."""
    lanes = LaneSet()
    lease = LaneLease(settings, lanes)
    async with pool.acquire() as conn:
        await lease.refresh(conn)
    return Consumer(pool, settings, lanes=lanes, member=lease.member, **kw)


async def counts(pool: asyncpg.Pool) -> dict[str, int]:
    out: dict[str, int] = {}
    for table in (
        "processed_webhook_events",
        "inbound_messages",
        "message_statuses",
        "account_errors",
        "account_updates",
    ):
        out[table] = await pool.fetchval(f"SELECT count(*) FROM {table}")
    return out


async def lanes_held_by(pool: asyncpg.Pool, n: int) -> bool:
    """Whether exactly ``n`` consumer processes own lanes under a live lease."""
    owners = await pool.fetchval(
        "SELECT count(DISTINCT owner) FROM inbox_lanes WHERE owner IS NOT NULL AND lease_until > now()"
    )
    return bool(owners == n)


async def inbox_states(pool: asyncpg.Pool) -> dict[str, int]:
    rows = await pool.fetch("SELECT state, count(*) AS n FROM inbox_row_states() GROUP BY state")
    return {r["state"]: r["n"] for r in rows}


async def add_outbox(pool: asyncpg.Pool, callback: str, state: str = "sending", **cols: Any) -> int:
    names = ["tenant", "idem_key", "callback_data", "recipient", "payload", "state", *cols]
    values = ["acme", callback, callback, "4915112345678", {"type": "text"}, state, *cols.values()]
    marks = ", ".join(f"${i + 1}" for i in range(len(values)))
    outbox_id: int = await pool.fetchval(
        f"INSERT INTO outbox ({', '.join(names)}) VALUES ({marks}) RETURNING id", *values
    )
    return outbox_id


async def outbox_row(pool: asyncpg.Pool, callback: str) -> dict[str, Any]:
    row = await pool.fetchrow(
        "SELECT state, wamid, delivery_status, delivery_errors, accepted_at"
        " FROM outbox WHERE callback_data = $1",
        callback,
    )
    assert row is not None
    return dict(row)
