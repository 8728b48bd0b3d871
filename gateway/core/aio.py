"""Small asyncio helpers shared by the long-running loops."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any


async def wait_set(event: asyncio.Event, seconds: float | None) -> bool:
    """Wait until ``event`` is set, at most ``seconds`` (None: no bound); True when it is set.

    ``asyncio.timeout``, not ``asyncio.wait_for``: on Python 3.11, a task cancelled in the step
    where the awaited wait completes gets wait_for's result and not the cancellation, so a loop
    cancelled at that moment would go on (a loop that never stops holds its process's exit)."""
    if not event.is_set():
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await event.wait()
    return event.is_set()


async def sleep_unless_stopped(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep ``seconds`` or until ``stop`` is set; True when stopped."""
    return await wait_set(stop, seconds)


async def back_off(stop: asyncio.Event, wake: asyncio.Event, seconds: float, floor_s: float) -> None:
    """Wait ``seconds``, or less: after ``floor_s`` a ``wake`` ends it (a NOTIFY, or a LISTEN
    made again: the database answers again, after a failover say, and a long backoff would only
    leave the work waiting); ``stop`` ends it at any time."""
    if await sleep_unless_stopped(stop, min(floor_s, seconds)):
        return
    await first_set(stop, wake, within=max(0.0, seconds - floor_s))


def setter(event: asyncio.Event) -> Callable[[Any], None]:
    """A callback that sets ``event``, e.g. an asyncpg termination listener (LISTEN connection lost)."""
    return lambda _conn: event.set()


async def first_set(*events: asyncio.Event, within: float | None = None) -> None:
    """Return when any of ``events`` is set, or after ``within`` seconds (None: no bound)."""
    waits = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waits, timeout=within, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
