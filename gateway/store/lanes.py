"""Which consumer process owns which lane of ``webhook_inbox``: members, leases and the lanes'
cursors as stored (``inbox_lanes``, ``consumer_members``). The cursors move in the consumers'
batch statement (``gateway.store.inbox``)."""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg

from gateway.core.lanes import Cursor, Snapshot
from gateway.store.db import Conn
from gateway.store.sqlfiles import q


def cursor(r: asyncpg.Record) -> Cursor:
    pos = None if r["pos_txid"] is None else (r["pos_txid"], r["pos_id"])
    win = None if r["win"] is None else Snapshot.parse(r["win"])
    return Cursor(r["lane"], r["version"], Snapshot.parse(r["done"]), win, pos)


async def beat(conn: Conn, *, member: str) -> None:
    """``member`` is alive, and ``conn`` (a connection of its own) stands for it."""
    await conn.execute(q("lanes_member_beat"), member)


async def members(conn: Conn, *, ttl_s: float) -> list[str]:
    """The live members: seen within ``ttl_s`` and their connection still open."""
    return [r["member"] for r in await conn.fetch(q("lanes_members"), ttl_s)]


async def shards(conn: Conn) -> dict[int, int]:
    return {r["lane"]: r["shard"] for r in await conn.fetch(q("lanes_shards"))}


async def lease(
    conn: Conn, *, member: str, lanes: Sequence[int], live: Sequence[str], ttl_s: float
) -> list[Cursor]:
    """Keep or take ``lanes`` (those free, expired or held by a member not in ``live``), let
    the others go; every lane ``member`` owns afterwards, with its cursor."""
    rows = await conn.fetch(q("lanes_lease"), member, list(lanes), list(live), ttl_s)
    return [cursor(r) for r in rows if r["lane"] is not None]


async def release(conn: Conn, *, member: str) -> None:
    """``member`` lets its lanes go (and stays a member)."""
    await conn.execute(q("lanes_release"), member)


async def leave(conn: Conn, *, member: str) -> None:
    """``member`` stops: its lanes are free at once."""
    await conn.execute(q("lanes_leave"), member)


async def cursors(conn: Conn, *, lanes: Sequence[int], member: str) -> list[Cursor]:
    """The stored cursors of ``lanes`` that ``member`` owns."""
    return [cursor(r) for r in await conn.fetch(q("lanes_cursors"), list(lanes), member)]


async def state(conn: Conn) -> list[asyncpg.Record]:
    """Every lane: owner, lease, cursor (``gateway lanes``)."""
    return list(await conn.fetch(q("lanes_state")))
