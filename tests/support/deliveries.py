"""Deliveries as tests set them up beside the forwarder: made up in the tables (migration 0021:
delivery_events, delivery_queue, delivery_log) or moved in time. Reading goes through the
store, or the view ``deliveries``."""

from __future__ import annotations

from datetime import UTC, datetime

import asyncpg

from gateway.store import retention


async def received(pool: asyncpg.Pool, expr: str) -> None:
    """Set every delivery's (and its event's) receipt time to ``expr``, an SQL expression in
    which ``{id}`` is the event id, e.g. ``now() - make_interval(hours => {id} % 3)``. (The
    values are computed first and written as constants: a Citus cluster refuses a stable
    function over a column in an UPDATE of a distributed table.)"""
    async with pool.acquire() as conn, conn.transaction():
        ids = [r["id"] for r in await conn.fetch("SELECT id FROM delivery_events")]
        at = {
            r["id"]: r["at"]
            for r in await conn.fetch(
                f"SELECT id, {expr.format(id='id')} AS at FROM unnest($1::bigint[]) AS t(id)", ids
            )
        }
        for table, column in (
            ("delivery_events", "id"),
            ("delivery_queue", "event_id"),
            ("delivery_log", "event_id"),
        ):
            await conn.execute(
                f"UPDATE {table} x SET received_at = v.at"
                " FROM (SELECT * FROM unnest($1::bigint[], $2::timestamptz[]) AS v(id, at)) v"
                f" WHERE x.{column} = v.id",
                list(at),
                list(at.values()),
            )


async def due(pool: asyncpg.Pool, expr: str, key: str | None = None) -> list[int]:
    """Make queued deliveries (of event ``key``, or all) due at ``expr`` (read once)."""
    rows = await pool.fetch(
        f"UPDATE delivery_queue q SET due = c.at FROM delivery_events e, (SELECT {expr} AS at) c"
        " WHERE e.id = q.event_id AND e.day = q.event_day AND e.lane = q.lane"
        " AND ($1::text IS NULL OR e.event_key = $1)"
        " RETURNING q.event_id",
        key,
    )
    return [r["event_id"] for r in rows]


async def made_up(
    pool: asyncpg.Pool,
    *,
    destination_id: int,
    key: str,
    state: str,
    received_at: datetime,
    last_status: int | None = None,
) -> int:
    """One delivery of a made-up event (body ``{}``) in ``state`` as the forwarder leaves it:
    queued (pending, failed) or in the log (delivered, that day); stored on the day it was
    received (its partitions made if need be). Its event id."""
    day = received_at.astimezone(UTC).date()
    async with pool.acquire() as conn:
        for table in ("delivery_events", "delivery_log"):
            await retention.ensure_day(conn, table=table, day=day)
        async with conn.transaction():
            event_id: int = await conn.fetchval(
                "INSERT INTO delivery_events (day, lane, received_at, event_key, kind, body)"
                " VALUES ($1, 0, $2, $3, 'message', '{}') RETURNING id",
                day,
                received_at,
                key,
            )
            if state == "delivered":
                await conn.execute(
                    "INSERT INTO delivery_log (day, at, destination_id, event_id, received_at, event_day,"
                    " attempt, lane, status, outcome) VALUES ($1, $2, $3, $4, $2, $1, 1, 0, $5, 'delivered')",
                    day,
                    received_at,
                    destination_id,
                    event_id,
                    last_status or 200,
                )
            else:
                await conn.execute(
                    "INSERT INTO delivery_queue (destination_id, event_id, received_at, event_day, lane,"
                    " failed, last_status) VALUES ($1, $2, $3, $4, 0, $5, $6)",
                    destination_id,
                    event_id,
                    received_at,
                    day,
                    state == "failed",
                    last_status,
                )
    return event_id
