"""``media``: media ids the gateway has seen (inbound or uploaded) and the number of each."""

from __future__ import annotations

from collections.abc import Iterable

import asyncpg

from gateway.store.db import Conn
from gateway.store.sqlfiles import q


async def get(conn: Conn, media_id: str) -> asyncpg.Record | None:
    r: asyncpg.Record | None = await conn.fetchrow(q("media_get"), media_id)
    return r


async def numbers(conn: Conn, media_ids: Iterable[str]) -> dict[str, str]:
    """media id -> the number it belongs to, for the ids the gateway knows."""
    rows = await conn.fetch(q("media_numbers"), sorted(set(media_ids)))
    return {r["media_id"]: r["phone_number_id"] for r in rows}


async def record_upload(
    conn: Conn, *, media_id: str, phone_number_id: str, tenant: str, mime_type: str | None
) -> None:
    await conn.execute(q("media_record_upload"), media_id, phone_number_id, tenant, mime_type)
