"""A process's consumers: ``consumer_concurrency`` loops sharing one LISTEN connection."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import asyncpg

from gateway.core.aio import setter, sleep_unless_stopped
from gateway.core.backoff import backoff_delay
from gateway.core.planning import describe
from gateway.core.settings import Settings
from gateway.handlers import Registry
from gateway.handlers import load as load_handlers
from gateway.inbound.consumer import Consumer
from gateway.store import inbox
from gateway.store.db import connect

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
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def _wake_all(self, *_: Any) -> None:
        for c in self.consumers:
            c.wake.set()

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
        """Wake the consumers on NOTIFY; on a lost connection, reconnect (polling covers the gap)."""
        assert self._s.database_url
        attempt = 0
        while not self._stop.is_set():
            conn: asyncpg.Connection | None = None
            try:
                conn = await connect(self._s.database_url, timeout=self._s.db_connect_timeout_s)
                lost = asyncio.Event()
                conn.add_termination_listener(setter(lost))
                await conn.add_listener(inbox.CHANNEL, self._wake_all)
                attempt = 0
                self._wake_all()  # rows staged while we were not listening
                stop_wait = asyncio.ensure_future(self._stop.wait())
                lost_wait = asyncio.ensure_future(lost.wait())
                await asyncio.wait({stop_wait, lost_wait}, return_when=asyncio.FIRST_COMPLETED)
                stop_wait.cancel()
                lost_wait.cancel()
            except Exception as exc:
                attempt += 1
                log.warning("LISTEN %s failed (%s); polling meanwhile", inbox.CHANNEL, describe(exc))
            finally:
                if conn is not None and not conn.is_closed():
                    with contextlib.suppress(Exception):
                        await conn.close(timeout=2)
            if not self._stop.is_set():
                await sleep_unless_stopped(self._stop, backoff_delay(max(attempt, 1), 0.5, 30))
