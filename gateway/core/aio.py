"""Small asyncio helpers shared by the long-running loops."""

from __future__ import annotations

import asyncio
import contextlib


async def sleep_unless_stopped(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep ``seconds`` or until ``stop`` is set; True when stopped."""
    if not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), seconds)
    return stop.is_set()
