"""Handlers for the tests: each call is recorded in ``handled`` (no unique key: a second
call for one event would show as a second row). ``GATEWAY_HANDLERS=tests.support.handlers``."""

from __future__ import annotations

import asyncio
from typing import Any

from gateway.core.events import InboundMessage, Status
from gateway.handlers import Registry, on

TABLE = "CREATE TABLE handled (event_key text NOT NULL, handler text NOT NULL, at timestamptz DEFAULT now())"
RECORD = "INSERT INTO handled (event_key, handler) VALUES ($1, $2)"


async def on_message(event: InboundMessage, conn: Any) -> None:
    await conn.execute(RECORD, event.key, "message")
    if event.wamid.startswith("wamid.RAISE"):
        raise ValueError(f"cannot handle {event.wamid}")
    # Broken until the test "fixes the cause" by dropping the table.
    if event.wamid.startswith("wamid.BROKEN") and await conn.fetchval(
        "SELECT to_regclass('handler_broken') IS NOT NULL"
    ):
        raise ValueError(f"cannot handle {event.wamid} while handler_broken exists")
    if event.wamid.startswith("wamid.SLOWSQL"):
        await conn.execute("SELECT pg_sleep(30)")
    if event.wamid.startswith("wamid.SLOW"):
        await asyncio.sleep(30)


async def on_status(event: Status, conn: Any) -> None:
    await conn.execute(RECORD, event.key, f"status:{event.status}")


def register(registry: Registry) -> Registry:
    registry.message()(on_message)
    registry.status()(on_status)
    return registry


register(on)
