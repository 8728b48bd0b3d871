"""``destinations`` and ``deliveries``: forwarding to downstream HTTP endpoints. The only module
that knows their SQL (the consumers' batch statement in inbox.sql inserts deliveries)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from gateway.store.db import Conn
from gateway.store.sqlfiles import q

CHANNEL = "deliveries"
# pg_advisory_xact_lock key serialising claims across forwarders ("forward").
CLAIM_LOCK_ID = 0x666F_7277_6172_64
# A connection that can open a transaction (not a pool).
Tx = asyncpg.Connection | PoolConnectionProxy


class DestinationExists(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Destination:
    id: int
    name: str
    url: str
    events: list[str]
    secret: str
    enabled: bool
    max_in_flight: int
    ordered: bool
    breaker_state: str
    consecutive_failures: int
    breaker_changed_at: datetime
    created_at: datetime
    backlog: int
    failed: int


@dataclass(frozen=True, slots=True)
class Claimed:
    """One delivery claimed for an attempt, with what its request needs."""

    id: int
    webhook_id: str
    body: bytes
    attempts: int
    received_at: datetime
    window_start: datetime
    destination_id: int
    destination: str
    url: str
    secret: str


@dataclass(frozen=True, slots=True)
class Result:
    id: int
    state: str
    delay_s: float | None
    status: int | None
    error: str | None


@dataclass(frozen=True, slots=True)
class Gauge:
    name: str
    breaker_state: str
    enabled: bool
    backlog: int
    oldest_due_s: float


@dataclass(frozen=True, slots=True)
class Delivery:
    id: int
    destination: str
    webhook_id: str
    event_key: str
    kind: str
    state: str
    attempts: int
    received_at: datetime
    next_attempt_at: datetime
    last_status: int | None
    last_error: str | None
    delivered_at: datetime | None


# --- destinations ---------------------------------------------------------------------------


async def add_destination(
    conn: Conn, *, name: str, url: str, events: Sequence[str], secret: str, max_in_flight: int, ordered: bool
) -> int:
    """Insert a destination; ``DestinationExists`` if the name is taken."""
    dest_id: int | None = await conn.fetchval(
        q("destination_add"), name, url, list(events), secret, max_in_flight, ordered
    )
    if dest_id is None:
        raise DestinationExists(name)
    return dest_id


async def list_destinations(conn: Conn) -> list[Destination]:
    return [Destination(**dict(r)) for r in await conn.fetch(q("destination_list"))]


async def get_destination(conn: Conn, *, name: str) -> asyncpg.Record | None:
    r: asyncpg.Record | None = await conn.fetchrow(q("destination_get"), name)
    return r


async def set_enabled(conn: Conn, *, name: str, enabled: bool) -> bool:
    """True if the destination exists. Enabling wakes the forwarders for its backlog."""
    found = await conn.fetchval(q("destination_set_enabled"), name, enabled) is not None
    if found and enabled:
        await conn.execute(q("deliveries_notify"))
    return found


async def remove_destination(conn: Conn, *, name: str) -> int | None:
    """Delete it and its deliveries; how many deliveries went with it (None: no such name)."""
    r = await conn.fetchrow(q("destination_remove"), name)
    return None if r is None else int(r["deliveries"])


# --- the forwarder ----------------------------------------------------------------------------


async def cycle(
    conn: Tx,
    *,
    results: Sequence[Result],
    breakers: Sequence[tuple[int, bool, int]],
    threshold: int,
    limit: int,
    lease_s: float,
    cooldown_s: float,
    housekeeping: bool,
) -> tuple[list[Claimed], list[tuple[str, str, str]], list[str]]:
    """One forwarder round in one short transaction, serialised across forwarders: write
    finished attempts and breaker counts; with ``housekeeping`` release expired leases and move
    breakers whose cool-down passed to half-open; claim up to ``limit`` due deliveries.
    Returns (claimed, breaker transitions as (destination, old, new), names now half-open)."""
    half: list[str] = []
    changes: list[tuple[str, str, str]] = []
    async with conn.transaction():
        await conn.execute(q("deliveries_cycle_begin"), CLAIM_LOCK_ID)
        if results:
            rows = await conn.fetch(
                q("deliveries_record"),
                [r.id for r in results],
                [r.state for r in results],
                [r.delay_s for r in results],
                [r.status for r in results],
                [r.error for r in results],
                [b[0] for b in breakers],
                [b[1] for b in breakers],
                [b[2] for b in breakers],
                threshold,
            )
            changes = [(r["name"], r["old"], r["new"]) for r in rows if r["old"] != r["new"]]
        if housekeeping:
            await conn.execute(q("deliveries_release_expired"))
            half = [r["name"] for r in await conn.fetch(q("destinations_half_open"), cooldown_s)]
        rows = await conn.fetch(q("deliveries_claim"), limit, lease_s) if limit > 0 else []
    claimed = [
        Claimed(
            id=r["id"],
            webhook_id=r["webhook_id"],
            body=r["body"].encode(),
            attempts=r["attempts"],
            received_at=r["received_at"],
            window_start=r["window_start"],
            destination_id=r["destination_id"],
            destination=r["destination"],
            url=r["url"],
            secret=r["secret"],
        )
        for r in rows
    ]
    return claimed, changes, half


async def gauges(conn: Conn) -> list[Gauge]:
    return [Gauge(**dict(r)) for r in await conn.fetch(q("deliveries_gauges"))]


# --- operators ------------------------------------------------------------------------------


async def list_deliveries(
    conn: Conn,
    *,
    destination: str | None,
    since: datetime | None,
    until: datetime | None,
    state: str | None,
    limit: int,
) -> list[Delivery]:
    rows = await conn.fetch(q("deliveries_list"), destination, since, until, state, limit)
    return [Delivery(**dict(r)) for r in rows]


async def count_deliveries(
    conn: Conn, *, destination: str | None, since: datetime | None, until: datetime | None
) -> dict[str, int]:
    rows = await conn.fetch(q("deliveries_count"), destination, since, until)
    return {r["state"]: r["n"] for r in rows}


async def replay(
    conn: Tx,
    *,
    destination: str | None,
    since: datetime | None,
    until: datetime | None,
    state: str,
) -> int:
    """Finished deliveries in the range back to pending now; how many."""
    async with conn.transaction():
        rows = await conn.fetch(q("deliveries_replay"), destination, since, until, state)
        if rows:
            await conn.execute(q("deliveries_notify"))
    return len(rows)


async def insert_rebuilt(conn: Conn, *, destination_id: int, rows: Sequence[dict[str, Any]]) -> int:
    """Backfill: deliveries for rebuilt events the destination does not have yet; how many."""
    if not rows:
        return 0
    n: int = await conn.fetchval(q("deliveries_insert"), destination_id, list(rows))
    return n


BACKFILL_QUERIES = {
    "message": ("backfill_messages",),
    "status": ("backfill_statuses",),
    "account": ("backfill_account_errors", "backfill_account_updates"),
}


async def backfill_page(
    conn: Conn, *, query: str, since: datetime, until: datetime, after_id: int, limit: int
) -> list[dict[str, Any]]:
    """One page of already-processed events of one table, by id."""
    assert query in {name for names in BACKFILL_QUERIES.values() for name in names}
    return [dict(r) for r in await conn.fetch(q(query), since, until, after_id, limit)]
