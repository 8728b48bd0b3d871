"""``send_pacing`` and ``send_breakers``: the senders' shared pace and circuit breakers.

Each key is touched only under a transaction-scoped advisory lock of its name, so a claim
reads a key's value, decides, and writes it back with no other sender in between.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from gateway.core.pacing import Breaker, BreakerId
from gateway.store.db import Conn
from gateway.store.sqlfiles import q


async def try_lock(conn: Conn, keys: Iterable[str]) -> set[str]:
    """Lock what is free (inside a transaction) and return it; keys others hold are left out."""
    return {r["k"] for r in await conn.fetch(q("pacing_try_lock"), sorted(set(keys)))}


async def lock(conn: Conn, keys: Iterable[str]) -> None:
    """Wait for every key (inside a transaction), in sorted order."""
    await conn.fetchval(q("pacing_lock"), sorted(set(keys)))


async def get(conn: Conn, keys: Iterable[str]) -> dict[str, float]:
    return {r["key"]: r["at"] for r in await conn.fetch(q("pacing_get"), list(keys))}


async def put(conn: Conn, values: Mapping[str, float]) -> None:
    if values:
        await conn.execute(q("pacing_put"), list(values), list(values.values()))


async def purge(conn: Conn, *, before: float, limit: int) -> int:
    """Forget keys whose time is older than ``before``; returns how many."""
    status: str = await conn.execute(q("pacing_purge"), before, limit)
    return int(status.split()[-1])


def _breaker(r: asyncpg.Record) -> Breaker:
    return Breaker(r["state"], r["failures"], r["retry_at"] or 0.0, r["code"], r["error"], r["probe_id"])


async def get_breakers(conn: Conn, ids: Iterable[BreakerId]) -> dict[BreakerId, Breaker]:
    """The breakers among ``ids`` that are not closed."""
    ids = list(ids)
    rows = await conn.fetch(
        q("breakers_get"), [b.scope for b in ids], [b.provider for b in ids], [b.key for b in ids]
    )
    return {BreakerId(r["scope"], r["provider"], r["key"]): _breaker(r) for r in rows}


async def put_breakers(conn: Conn, changes: Mapping[BreakerId, Breaker]) -> None:
    if not changes:
        return
    ids: Sequence[BreakerId] = list(changes)
    bs = [changes[i] for i in ids]
    await conn.execute(
        q("breakers_put"),
        [i.scope for i in ids],
        [i.provider for i in ids],
        [i.key for i in ids],
        [b.state for b in bs],
        [b.failures for b in bs],
        [b.retry_at if b.state != "closed" else None for b in bs],
        [b.code for b in bs],
        [b.error for b in bs],
        [b.probe_id for b in bs],
    )


async def list_breakers(conn: Conn) -> list[asyncpg.Record]:
    return list(await conn.fetch(q("breakers_list")))


async def wake_rows(conn: Conn, b: BreakerId, *, now: float) -> int:
    """The rows a closed breaker held back are due at ``now``; returns how many. A token's
    breaker may hold rows of several numbers (those that share the token): every put-off row
    of the provider is due again, and the next claim puts off again what pacing or another
    breaker still holds."""
    status: str = await conn.execute(q("breakers_wake_rows"), b.scope, b.provider, b.key, now)
    return int(status.split()[-1])


async def resume(conn: asyncpg.Connection | PoolConnectionProxy, b: BreakerId, *, now: float) -> bool:
    """An operator closes a breaker: its rows are due now. False: it was not open."""
    async with conn.transaction():
        await lock(conn, [b.lock_key])
        current = await get_breakers(conn, [b])
        if b not in current:
            return False
        await put_breakers(conn, {b: Breaker("closed")})
        await wake_rows(conn, b, now=now)
    return True
