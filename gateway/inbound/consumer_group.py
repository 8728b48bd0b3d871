"""A process's consumers: ``consumer_concurrency`` loops sharing one LISTEN connection, which
wakes one idle consumer per NOTIFY."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from typing import Any

import asyncpg

from gateway.core.settings import Settings
from gateway.handlers import Registry
from gateway.handlers import load as load_handlers
from gateway.inbound.consumer import Consumer
from gateway.store import inbox
from gateway.store.listen import listen, own_connection

log = logging.getLogger(__name__)


class ConsumerGroup:
    """``consumer_concurrency`` consumers sharing one LISTEN connection."""

    def __init__(self, pool: asyncpg.Pool, settings: Settings, handlers: Registry | None = None) -> None:
        self._pool = pool
        self._s = settings
        if handlers is None and settings.handlers:
            handlers = load_handlers(settings.handlers)  # an import error stops the start-up
        self.consumers = [
            Consumer(pool, settings, handlers=handlers) for _ in range(settings.consumer_concurrency)
        ]
        for c in self.consumers:
            c.on_more = self._wake_one
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def on_deliveries(self, wake: Callable[[], None]) -> None:
        """Call ``wake`` after each committed batch that inserted deliveries (an in-process
        forwarder's wake-up; other processes' forwarders are woken by NOTIFY)."""
        for c in self.consumers:
            c.on_deliveries = wake

    def _wake_all(self, *_: Any) -> None:
        for c in self.consumers:
            c.wake.set()

    def _wake_one(self, *_: Any) -> None:
        """A NOTIFY (or a batch that left more due): one idle consumer claims. Waking them all
        had every consumer but one claim nothing, half the batches under load, each a
        transaction and a look at the dead items for nothing. When none is idle, each looks
        again after its batch."""
        for c in self.consumers:
            if c.idle:
                c.idle = False  # taken: the next NOTIFY wakes another
                c.wake.set()
                return
        self._wake_all()

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(c.run(self._stop)) for c in self.consumers]
        self._tasks.append(loop.create_task(self._listen()))

    async def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        self._wake_all()
        _done, pending = await asyncio.wait(self._tasks, timeout=timeout_s) if self._tasks else ((), ())
        for t in pending:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _listen(self) -> None:
        """Wake the consumers on NOTIFY (polling covers the gaps)."""
        assert self._s.database_url
        opener = functools.partial(own_connection, self._s.database_url, self._s.db_connect_timeout_s)
        await listen(opener, inbox.CHANNEL, self._wake_one, self._stop)
