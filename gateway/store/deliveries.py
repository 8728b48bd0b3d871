"""``destinations`` and ``deliveries``: forwarding to downstream HTTP endpoints. The only module
that knows their SQL (the consumers' batch statement in inbox.sql inserts deliveries)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from gateway.store.db import Conn
from gateway.store.sqlfiles import q

CHANNEL = "deliveries"
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
    previous_secret: str | None  # still valid (signed with too) until previous_secret_until
    previous_secret_until: datetime | None
    created_at: datetime
    backlog: int
    failed: int
    gone: bool  # disabled after answering 410 Gone
    numbers: list[str] | None = None  # only these numbers' events (None: every number)
    tenant: str | None = None  # a tenant's destination (its numbers when it was added)
    format: str = "standard"  # or "meta": each event as Meta's own webhook body


class Claimed(NamedTuple):
    """One delivery claimed for an attempt, with what its request needs. (Tuples: one is
    built per delivery on the forwarder's hot path, where a frozen dataclass costs 3x.)"""

    id: int
    webhook_id: str
    body: bytes
    attempts: int
    received_at: float  # Unix time the gateway received the event
    window_start: float  # Unix time the retry window started
    destination_id: int
    destination: str
    url: str
    secret: str
    ordered: bool  # the destination's per-conversation ordering
    previous_secret: str | None  # during a rotation's grace period: signed with it too
    meta: bool = False  # a Meta-format destination: body is Meta's, signed X-Hub-Signature-256


class Result(NamedTuple):
    id: int
    state: str
    delay_s: float | None
    status: int | None
    error: str | None
    ordered: bool = False  # of an ordered destination (its conversation's next may be due)


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
    conn: Conn,
    *,
    name: str,
    url: str,
    events: Sequence[str],
    secret: str,
    max_in_flight: int,
    ordered: bool,
    numbers: Sequence[str] | None = None,
    tenant: str | None = None,
    format: str = "standard",
) -> int:
    """Insert a destination; ``DestinationExists`` if the name is taken. ``numbers``: it gets only
    events of these business numbers; ``format``: standard or meta."""
    dest_id: int | None = await conn.fetchval(
        q("destination_add"),
        name,
        url,
        list(events),
        secret,
        max_in_flight,
        ordered,
        None if numbers is None else list(numbers),
        tenant,
        format,
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


async def rotate_secret(conn: Conn, *, name: str, secret: str, grace_s: float) -> datetime | None:
    """Make ``secret`` the destination's secret, the current one valid for ``grace_s`` more
    seconds; until when (None: no such destination)."""
    until: datetime | None = await conn.fetchval(q("destination_rotate_secret"), name, secret, grace_s)
    return until


async def remove_destination(conn: Conn, *, name: str) -> int | None:
    """Delete it and its deliveries; how many deliveries went with it (None: no such name)."""
    r = await conn.fetchrow(q("destination_remove"), name)
    return None if r is None else int(r["deliveries"])


# --- the forwarder ----------------------------------------------------------------------------


async def cycle(
    conn: Conn,
    *,
    forwarder: str,
    results: Sequence[Result],
    breakers: Sequence[tuple[int, bool, int]],
    threshold: int,
    limit: int,
    lease_s: float,
    cooldown_s: float,
    housekeeping: bool,
    held: Collection[int] = (),
    gone: Collection[int] = (),
) -> tuple[list[Claimed], list[tuple[str, str, str]], list[str]]:
    """One round of ``forwarder``, one statement and round trip, serialised across forwarders:
    write finished attempts and breaker counts, claim up to ``limit`` due deliveries and renew
    the forwarder's leases on what it holds; with ``housekeeping``, then delete dead
    forwarders' expired leases and move breakers whose cool-down passed to half-open (their
    deliveries are claimed in the next round). ``gone``: destinations that answered 410 Gone,
    disabled in the same statement. ``held``: the ids the forwarder still holds besides
    ``results`` (its leases keep only those, so a claim whose answer never reached it is
    due again). Returns (claimed, breaker transitions as (destination,
    old, new) and a (destination, "enabled", "gone") per destination disabled, names now
    half-open).

    One transaction. If the call fails or is cancelled, the connection is terminated (a pool
    replaces it, a forwarder's own connection is reopened): a cancel must not wait on a
    silent network."""
    try:
        rows = await conn.fetch(
            q("forward_round"),
            [r.id for r in results],
            [r.state for r in results],
            [r.delay_s for r in results],
            [r.status for r in results],
            [r.error for r in results],
            [b[0] for b in breakers],
            [b[1] for b in breakers],
            [b[2] for b in breakers],
            threshold,
            limit,
            lease_s,
            list(gone),
            forwarder,
            housekeeping,
            cooldown_s,
            list(held),
        )
    except BaseException:
        conn.terminate()
        raise
    # Rows by kind (sql/functions/forward_round.sql): a claimed row carries Claimed's columns
    # in its order after the kind (the body goes out as bytes); the others name a destination.
    claimed: list[Claimed] = []
    changes: list[tuple[str, str, str]] = []
    half: list[str] = []
    for r in rows:
        kind = r[0]
        if kind == "claimed":
            claimed.append(Claimed(r[1], r[2], r[3].encode(), *r[4:14]))
        elif kind == "breaker":
            changes.append((r[8], r[14], r[15]))
        elif kind == "disabled":
            changes.append((r[8], "enabled", "gone"))
        elif kind == "half_open":
            half.append(r[8])
        else:
            raise ValueError(f"forward_round returned a row of unknown kind {kind!r}")
    return claimed, changes, half


async def gauges(conn: Conn, *, cap: int) -> list[Gauge]:
    """Per destination: backlog (counted up to ``cap``), oldest due age, breaker, enabled."""
    return [Gauge(**dict(r)) for r in await conn.fetch(q("deliveries_gauges"), cap)]


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
