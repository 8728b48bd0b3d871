"""Small asyncio helpers shared by the long-running loops."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any


async def sleep_unless_stopped(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep ``seconds`` or until ``stop`` is set; True when stopped."""
    if not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), seconds)
    return stop.is_set()


def setter(event: asyncio.Event) -> Callable[[Any], None]:
    """A callback that sets ``event``, e.g. an asyncpg termination listener (LISTEN connection lost)."""
    return lambda _conn: event.set()


async def first_set(*events: asyncio.Event) -> None:
    """Return when any of ``events`` is set."""
    waits = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
