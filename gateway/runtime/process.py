"""What every long-running command does to its own process: uvloop as the event loop, the
garbage collector tuned for a server, and the main coroutine run to its exit status."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger("gateway")


def install_uvloop() -> None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency off Windows
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def tune_gc() -> None:
    """Fewer, cheaper collections for a long-running server.

    Every request allocates a few hundred short-lived objects, so the default gen-0
    threshold (700) runs a collection every couple of requests; the modules and app
    loaded at start-up are frozen so no collection ever walks them again.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, 10, 10)
    log.debug(
        "garbage collector: %d objects frozen, thresholds %s", gc.get_freeze_count(), gc.get_threshold()
    )


def run(coro: Coroutine[Any, Any, int]) -> int:
    """Run a command's main coroutine on uvloop; its result is the exit status."""
    install_uvloop()
    return asyncio.run(coro)
