"""``operator_actions`` (the audit log of operators' actions) and ``maintenance_passes``."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gateway.store.db import Conn
from gateway.store.sqlfiles import q


@dataclass(frozen=True, slots=True)
class Entry:
    id: int
    at: datetime
    actor: str
    via: str
    action: str
    target: str
    params: dict[str, Any]
    rows: int
    outcome: str


async def record(
    conn: Conn,
    *,
    actor: str,
    via: str,
    action: str,
    target: str,
    params: dict[str, Any],
    rows: int,
    outcome: str,
) -> int:
    """One entry; call it in the action's own transaction."""
    entry_id: int = await conn.fetchval(q("audit_record"), actor, via, action, target, params, rows, outcome)
    return entry_id


async def page(
    conn: Conn, *, before: int | None, actor: str | None, action: str | None, limit: int
) -> list[Entry]:
    """Entries newest first, older than ``before`` (an id)."""
    rows = await conn.fetch(q("audit_page"), before, actor, action, limit)
    return [Entry(**dict(r)) for r in rows]


@dataclass(frozen=True, slots=True)
class Pass:
    job: str
    last_ok_at: datetime | None
    last_failed_at: datetime | None
    last_error: str | None


async def record_pass(conn: Conn, *, job: str, error: str | None) -> None:
    await conn.execute(q("maintenance_pass_record"), job, error)


async def passes(conn: Conn) -> list[Pass]:
    return [Pass(**dict(r)) for r in await conn.fetch(q("maintenance_passes"))]
