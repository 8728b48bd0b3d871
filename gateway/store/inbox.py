"""``webhook_inbox`` and what the consumers write beside it: staging, the lanes' reads, the
batch statement, webhooks moved aside (``inbox_parked``). The only module that knows these
tables' SQL (the lanes' leases: ``gateway.store.lanes``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import asyncpg
import orjson
from asyncpg.pool import PoolConnectionProxy

from gateway.core.lanes import Cursor, Snapshot, read_params
from gateway.core.planning import Plan, StagedRow
from gateway.store.db import Conn
from gateway.store.sqlfiles import q

CHANNEL = "webhook_inbox"
# The payload on CHANNEL when the lanes' members or owners changed (empty: rows were staged).
LANES_CHANGED = "lanes"


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
    parked: int
    fresh_keys: list[str]
    deliveries: int = 0
    identities: int = 0
    # Status key -> the send API caller's biz_opaque_callback_data of its message (fresh only).
    callers: dict[str, str] = field(default_factory=dict)
    advanced: int = 0  # lanes whose cursors moved


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
    return StagedRow(r["id"], r["source"], bytes(r["body"]), r["delivery_id"], txid=r["txid"], lane=r["lane"])


@dataclass(frozen=True, slots=True)
class Read:
    """What ``inbox_read`` found: rows in (txid, id) order, the snapshot each lane read was
    read in, and whether it returned everything it found (else more is due at once)."""

    rows: list[StagedRow]
    snapshots: dict[int, Snapshot]
    exhausted: bool


async def insert_batch(
    conn: Conn,
    *,
    sources: Sequence[str],
    bodies: Sequence[bytes],
    delivery_ids: Sequence[str | None],
    lane: int | None = None,
) -> None:
    """Stage rows in arrival order, one statement (the group commit's write), all in ``lane``
    (None: each row in lane id % 32, as bulk loaders want)."""
    if lane is None:
        await conn.execute(q("inbox_insert_spread"), sources, bodies, delivery_ids)
    else:
        await conn.execute(q("inbox_insert_batch"), sources, bodies, delivery_ids, lane)


def read_args(cursors: Sequence[Cursor], *, limit: int, max_bytes: int) -> tuple[Any, ...]:
    """The parameters of ``inbox_read`` for these lanes, in its order."""
    p = read_params(cursors)
    return (
        p.lanes,
        p.dones,
        p.windows,
        p.pos_txids,
        p.pos_ids,
        p.start[0],
        p.start[1],
        p.in_progress,
        limit,
        max_bytes,
    )


async def read(conn: Conn, cursors: Sequence[Cursor], *, limit: int, max_bytes: int) -> Read:
    """The next rows of these lanes (``gateway.core.lanes``); nothing is locked or written."""
    recs = await conn.fetch(q("inbox_read"), *read_args(cursors, limit=limit, max_bytes=max_bytes))
    if not recs:
        return Read([], {}, True)
    taken = recs[0]["taken"]
    exhausted = taken < limit and taken == len(recs)
    given: list[str] = recs[0]["snapshots"]
    if len(given) == 1:  # the statement's own, for every lane
        one = Snapshot.parse(given[0])
        snapshots = dict.fromkeys((c.lane for c in cursors), one)
    else:  # per lane, at its number
        snapshots = {c.lane: Snapshot.parse(given[c.lane]) for c in cursors}
    return Read([_staged(r) for r in recs], snapshots, exhausted)


async def read_mode(conn: Conn, *, idle_ms: int, session: bool = False) -> None:
    """In the caller's transaction (``session``: for the connection's session, until the pool
    resets it): ``read`` plans without sorts, and a transaction may not sit idle longer than
    ``idle_ms``."""
    await conn.execute(q("inbox_read_mode"), str(idle_ms), not session)


async def get_row(conn: Conn, *, inbox_id: int) -> StagedRow | None:
    r = await conn.fetchrow(q("inbox_get_row"), inbox_id)
    return None if r is None else _staged(r)


def advance_arg(cursors: Sequence[Cursor], moved: Sequence[Cursor]) -> list[dict[str, Any]]:
    """The argument of ``inbox_advance``: each lane's version as read, and where it goes."""
    was = {c.lane: c.version for c in cursors}
    return [
        {
            "lane": c.lane,
            "version": was[c.lane],
            "done": c.done.text(),
            "win": None if c.window is None else c.window.text(),
            "pos_txid": None if c.pos is None else c.pos[0],
            "pos_id": None if c.pos is None else c.pos[1],
        }
        for c in moved
    ]


async def advance(conn: Conn, *, member: str, cursors: Sequence[Cursor], moved: Sequence[Cursor]) -> None:
    """Move the cursors of lanes whose batch had no rows (their windows closed)."""
    await conn.execute(q("inbox_advance"), member, advance_arg(cursors, moved))


async def move_aside(
    conn: Conn,
    *,
    row: StagedRow,
    member: str,
    cursors: Sequence[Cursor],
    moved: Sequence[Cursor],
    max_attempts: int,
    delay_s: float,
    error: str,
) -> str | None:
    """A row that failed where nothing could be recorded leaves its lane for ``inbox_parked``
    (retried on its own), and the lane's cursor passes it; its state there."""
    r = await conn.fetchrow(
        q("inbox_move_aside"), row.id, max_attempts, member, advance_arg(cursors, moved), error, delay_s
    )
    return None if r is None else r["state"]


async def parked_state(conn: Conn, *, inbox_id: int) -> str | None:
    """The state of a webhook moved aside (None: it was not)."""
    state: str | None = await conn.fetchval(q("inbox_parked_state"), inbox_id)
    return state


async def parked_due(conn: Conn) -> bool:
    """Whether a whole webhook moved aside is due again (no lock taken)."""
    return bool(await conn.fetchval(q("inbox_parked_due")))


async def parked_claim(conn: Conn, *, limit: int) -> list[StagedRow]:
    """Whole webhooks moved aside and due again, locked for the caller's transaction."""
    return [
        StagedRow(r["id"], r["source"], bytes(r["body"]), r["delivery_id"], r["attempts"])
        for r in await conn.fetch(q("inbox_parked_claim"), limit)
    ]


async def parked_attempt(
    conn: Conn, *, inbox_id: int, max_attempts: int, delay_s: float, error: str
) -> tuple[str, int] | None:
    """One more attempt against a webhook moved aside (dead at ``max_attempts``); its state and
    attempts, or None if it is no longer waiting for a retry."""
    r = await conn.fetchrow(q("inbox_parked_attempt"), inbox_id, max_attempts, delay_s, error)
    return None if r is None else (r["state"], r["attempts"])


async def parked_defer(conn: Conn, *, ids: Sequence[int], delay_s: float, error: str) -> None:
    """The system failed while these were retried: due again later, no attempt counted."""
    await conn.execute(q("inbox_parked_defer"), list(ids), delay_s, error)


async def parked_done(conn: Conn, *, ids: Sequence[int]) -> None:
    await conn.execute(q("inbox_parked_done"), list(ids))


async def apply_plan(
    conn: Conn,
    plan: Plan,
    *,
    member: str | None = None,
    advance: list[dict[str, Any]] | None = None,
    citus: bool = False,
) -> Applied:
    """handle_once for a whole batch: keys, side effects, rows moved aside and the lanes'
    cursors (``advance``, from ``advance_arg``; None: none move) in one statement (on a Citus
    coordinator, ``citus``: the same as a sequence of statements in one function call, which
    Citus can plan)."""
    r = await conn.fetchrow(
        q("inbox_apply_batch_steps" if citus else "inbox_apply_batch"),
        plan.keys,
        plan.key_inbox,
        plan.messages,
        plan.statuses,
        plan.account_errors,
        plan.account_updates,
        plan.parked,
        plan.parked_why,
        orjson.dumps(plan.forwards).decode() if plan.forwarding or not plan.keys else None,
        plan.key_days,
        plan.key_subjects,
        plan.links,
        member,
        advance,
    )
    assert r is not None
    return Applied(**dict(r))


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
