"""``webhook_inbox`` and what the consumers write beside it: staging, claims, the batch
statement, failures and dead letters. The only module that knows these tables' SQL."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

import asyncpg
import orjson
from asyncpg.pool import PoolConnectionProxy

from gateway.core.planning import Plan, StagedRow
from gateway.store.db import Conn
from gateway.store.sqlfiles import q

CHANNEL = "webhook_inbox"


@dataclass(frozen=True, slots=True)
class Applied:
    """Counts from one ``inbox_apply_batch``: keys newly inserted and effects per table."""

    fresh: int
    messages: int
    statuses: int
    account_errors: int
    account_updates: int
    outbox_updated: int
    messages_inserted: int
    statuses_inserted: int
    done: int
    parked: int
    fresh_keys: list[str]
    deliveries: int = 0
    identities: int = 0
    # Status key -> the send API caller's biz_opaque_callback_data of its message (fresh only).
    callers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class DeadRow:
    id: int
    source: str
    received_at: datetime
    delivery_id: str | None
    attempts: int
    bytes: int
    last_error: str | None


def _staged(r: asyncpg.Record) -> StagedRow:
    return StagedRow(r["id"], r["source"], bytes(r["body"]), r["delivery_id"], r["attempts"])


async def insert_batch(
    conn: Conn, *, sources: Sequence[str], bodies: Sequence[bytes], delivery_ids: Sequence[str | None]
) -> None:
    """Stage rows in arrival order, one statement (the group commit's write)."""
    await conn.execute(q("inbox_insert_batch"), sources, bodies, delivery_ids)


async def claim_batch(
    conn: Conn, *, limit: int, max_bytes: int, due_from: datetime | None = None
) -> tuple[list[StagedRow], bool]:
    """Due pending rows, locked for the caller's transaction (SKIP LOCKED), and whether more
    may be due right now: the claim was full, or the byte budget left some of the rows it
    locked. ``due_from``: a lower bound of every pending row's next_attempt_at (``due_from``),
    None to scan from the head of the due index."""
    recs = await conn.fetch(q("inbox_claim_batch"), limit, max_bytes, due_from)
    more = len(recs) >= limit or (bool(recs) and recs[0]["locked"] > len(recs))
    return [_staged(r) for r in recs], more


async def due_from(conn: Conn) -> datetime:
    """A lower bound of every pending row's next_attempt_at, for ``claim_batch``."""
    at: datetime = await conn.fetchval(q("inbox_due_from"))
    return at


async def claim_row(conn: Conn, *, inbox_id: int) -> StagedRow | None:
    r = await conn.fetchrow(q("inbox_claim_row"), inbox_id)
    return None if r is None else _staged(r)


async def claim_due_row(conn: Conn, *, inbox_id: int) -> StagedRow | None:
    """One row alone, if still pending and due; locked for the caller's transaction."""
    r = await conn.fetchrow(q("inbox_claim_due_row"), inbox_id)
    return None if r is None else _staged(r)


async def stall_attempt(
    conn: Conn, *, inbox_id: int, max_attempts: int, delay_s: float, error: str
) -> tuple[str, int] | None:
    """Count one attempt against a row that failed alone (dead at ``max_attempts``); its
    state and attempts, or None if it is no longer pending."""
    r = await conn.fetchrow(q("inbox_stall_attempt"), inbox_id, max_attempts, delay_s, error)
    return None if r is None else (r["state"], r["attempts"])


async def ensure_partition(conn: asyncpg.Connection | PoolConnectionProxy, *, table: str) -> bool:
    """Today's (and tomorrow's) day partition of ``table``, made now if missing (False: they
    existed), in a transaction of its own on ``conn`` that never waits long for a lock."""
    async with conn.transaction():
        await conn.execute(q("partition_lock_timeout"))
        return bool(await conn.fetchval(q("inbox_ensure_partition"), table))


async def apply_plan(conn: Conn, plan: Plan) -> Applied:
    """handle_once for a whole batch: keys, side effects and row states in one statement."""
    r = await conn.fetchrow(
        q("inbox_apply_batch"),
        plan.keys,
        plan.key_inbox,
        plan.messages,
        plan.statuses,
        plan.account_errors,
        plan.account_updates,
        plan.done,
        plan.parked,
        plan.parked_why,
        orjson.dumps(plan.forwards).decode(),
        plan.key_days,
        plan.key_subjects,
        plan.links,
    )
    assert r is not None
    return Applied(**dict(r))


async def defer(conn: Conn, *, ids: Sequence[int], delay_s: float, error: str) -> None:
    """The system failed on these rows: due again after ``delay_s``; no attempt counted."""
    await conn.execute(q("inbox_defer"), list(ids), delay_s, error)


async def notify(conn: Conn) -> None:
    await conn.execute(q("inbox_notify"))


async def dead_list(
    conn: Conn, *, limit: int, since: datetime | None = None, until: datetime | None = None
) -> list[DeadRow]:
    rows = await conn.fetch(q("inbox_dead_list"), limit, since, until)
    return [DeadRow(**dict(r)) for r in rows]


async def dead_count(conn: Conn, *, since: datetime | None = None, until: datetime | None = None) -> int:
    n: int = await conn.fetchval(q("inbox_dead_count"), since, until)
    return n


async def get(conn: Conn, *, inbox_id: int) -> asyncpg.Record | None:
    """Every column of one row, body included (for ``gateway dead show``)."""
    r: asyncpg.Record | None = await conn.fetchrow(q("inbox_get"), inbox_id)
    return r


async def dead_replay(
    conn: asyncpg.Connection | PoolConnectionProxy,
    *,
    ids: Sequence[int] | None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> list[int]:
    """Dead rows back to pending with a fresh budget (``ids=None``: every one in the range)."""
    async with conn.transaction():
        rows = await conn.fetch(q("inbox_dead_replay"), None if ids is None else list(ids), since, until)
        if rows:
            await notify(conn)
    return sorted(r["id"] for r in rows)


async def depth(conn: Conn, *, cap: int) -> int:
    """Pending rows, counted up to ``cap`` (a gauge at the cap means "at least")."""
    n: int = await conn.fetchval(q("inbox_depth"), cap)
    return n


async def lag_seconds(conn: Conn) -> float:
    """Age of the oldest pending row, due or deferred (0 when none)."""
    lag: float = await conn.fetchval(q("inbox_lag"))
    return lag
