"""``dead_events`` (events that failed on their own) and ``event_fragments`` (exact bytes of
events stored escaped). The only module that knows these tables' SQL."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg
import orjson

from gateway.store.db import Conn
from gateway.store.sqlfiles import q

RETRY, DEAD, DONE = "retry", "dead", "done"


@dataclass(frozen=True, slots=True)
class NewItem:
    """An event (or malformed fragment) of an inbox row that failed on its own."""

    inbox_id: int
    position: int
    path: str
    event_key: str | None
    kind: str
    source: str
    unit: str
    context: dict[str, Any]
    fragment: bytes
    state: str
    attempts: int
    deferrals: int
    delay_s: float
    error: str


@dataclass(frozen=True, slots=True)
class Claimed:
    id: int
    inbox_id: int
    position: int
    path: str
    event_key: str | None
    kind: str
    source: str
    unit: str
    context: dict[str, Any]
    fragment: bytes
    attempts: int
    deferrals: int


@dataclass(frozen=True, slots=True)
class Listed:
    id: int
    inbox_id: int
    path: str
    event_key: str | None
    kind: str
    source: str
    state: str
    attempts: int
    deferrals: int
    received_at: datetime
    next_attempt_at: datetime
    bytes: int
    last_error: str | None


async def record(conn: Conn, items: Sequence[NewItem]) -> None:
    """Insert new items (one statement); an item already recorded for the row is kept."""
    if not items:
        return
    await conn.execute(
        q("dead_events_record"),
        [i.inbox_id for i in items],
        [i.position for i in items],
        [i.path for i in items],
        [i.event_key for i in items],
        [i.kind for i in items],
        [i.source for i in items],
        [i.unit for i in items],
        [orjson.dumps(i.context).decode() for i in items],
        [i.fragment for i in items],
        [i.state for i in items],
        [i.attempts for i in items],
        [i.deferrals for i in items],
        [i.delay_s for i in items],
        [i.error for i in items],
    )


async def due(conn: Conn) -> bool:
    """Whether an item is due (no lock taken)."""
    return bool(await conn.fetchval(q("dead_events_due")))


async def claim(conn: Conn, *, limit: int) -> list[Claimed]:
    """Due items, locked for the caller's transaction (SKIP LOCKED)."""
    rows = await conn.fetch(q("dead_events_claim"), limit)
    return [Claimed(**{**dict(r), "fragment": bytes(r["fragment"])}) for r in rows]


async def failed(
    conn: Conn, *, item_id: int, state: str, attempts: int, deferrals: int, delay_s: float, error: str
) -> None:
    """A retry failed: add ``attempts``/``deferrals``, due again after ``delay_s`` (or dead)."""
    await conn.execute(q("dead_events_failed"), item_id, state, attempts, deferrals, delay_s, error)


async def done(conn: Conn, *, ids: Sequence[int]) -> None:
    if ids:
        await conn.execute(q("dead_events_done"), list(ids))


async def list_items(
    conn: Conn,
    *,
    states: Sequence[str],
    limit: int,
    since: datetime | None = None,
    until: datetime | None = None,
) -> list[Listed]:
    rows = await conn.fetch(q("dead_events_list"), list(states), since, until, limit)
    return [Listed(**dict(r)) for r in rows]


async def count(
    conn: Conn, *, states: Sequence[str], since: datetime | None = None, until: datetime | None = None
) -> int:
    n: int = await conn.fetchval(q("dead_events_count"), list(states), since, until)
    return n


async def get(conn: Conn, *, item_id: int) -> asyncpg.Record | None:
    r: asyncpg.Record | None = await conn.fetchrow(q("dead_events_get"), item_id)
    return r


async def replay(
    conn: Conn,
    *,
    ids: Sequence[int] | None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> list[int]:
    """Dead items due again with a fresh budget; the ids replayed."""
    rows = await conn.fetch(q("dead_events_replay"), None if ids is None else list(ids), since, until)
    return sorted(r["id"] for r in rows)


@dataclass(frozen=True, slots=True)
class Stats:
    retry: int
    dead: int
    oldest_retry_s: float


async def stats(conn: Conn) -> Stats:
    r = await conn.fetchrow(q("dead_events_stats"))
    assert r is not None
    return Stats(**dict(r))


async def record_fragments(
    conn: Conn,
    *,
    keys: Sequence[str],
    inbox_ids: Sequence[int],
    paths: Sequence[str],
    fragments: Sequence[bytes],
) -> None:
    """Keep the exact bytes of events stored escaped (only keys this transaction processed)."""
    if keys:
        await conn.execute(
            q("event_fragments_record"), list(keys), list(inbox_ids), list(paths), list(fragments)
        )
