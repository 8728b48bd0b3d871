"""A process's consumers: ``consumer_concurrency`` loops sharing one LISTEN connection, which
wakes one idle consumer per NOTIFY (a service: gateway.runtime.services)."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from typing import Any

import asyncpg

from gateway.core.aio import sleep_unless_stopped
from gateway.core.limits import LogThrottle
from gateway.core.settings import Settings
from gateway.core.spacing import Spacing
from gateway.handlers import Registry
from gateway.handlers import load as load_handlers
from gateway.inbound.consumer import Consumer, DueFrom
from gateway.store import inbox
from gateway.store.listen import listen, own_connection

log = logging.getLogger(__name__)
# How often the consumers' claim bound is read again (a row below it waits at most this long).
DUE_FROM_S = 0.5
_WARN = LogThrottle(60.0)


class ConsumerGroup:
    """``consumer_concurrency`` consumers sharing one LISTEN connection."""

    name = "consumers"
    # After a stop, a batch in progress may finish; one still running then is cancelled, and
    # its transaction rolled back leaves its rows due for the next consumer.
    stop_grace_s: float | None = 10.0

    def __init__(self, pool: asyncpg.Pool, settings: Settings, handlers: Registry | None = None) -> None:
        self._pool = pool
        self._s = settings
        if handlers is None and settings.handlers:
            handlers = load_handlers(settings.handlers)  # an import error stops the start-up
        self.due = DueFrom()
        spacing = Spacing(settings.consumer_batch_gap_ms / 1000)
        self.consumers = [
            Consumer(pool, settings, handlers=handlers, due=self.due, spacing=spacing)
            for _ in range(settings.consumer_concurrency)
        ]
        for c in self.consumers:
            c.on_more = self._wake_one

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
        again after its batch. One woken whose batch has not started yet (``Consumer.starting``:
        it may be waiting for its turn) will claim what was announced: none is woken for it."""
        if any(c.starting for c in self.consumers):
            return
        for c in self.consumers:
            if c.idle:
                c.idle = False  # taken
                c.starting = True
                c.wake.set()
                return
        self._wake_all()

    async def run(self, stop: asyncio.Event) -> None:
        """Consume until ``stop`` is set; then each consumer finishes its batch."""
        tasks = [asyncio.create_task(c.run(stop)) for c in self.consumers]
        tasks.append(asyncio.create_task(self._listen(stop)))
        tasks.append(asyncio.create_task(self._due_from(stop)))
        stopped = asyncio.create_task(stop.wait())
        stopped.add_done_callback(self._wake_all)  # idle consumers wait on their wake-up
        try:
            await asyncio.gather(*tasks)
        finally:
            stopped.cancel()
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def close(self) -> None:
        """Nothing to release: the consumers use the pool, the listener closed its connection."""

    async def _due_from(self, stop: asyncio.Event) -> None:
        """Keep the claims' lower bound current; when it cannot be read, claims scan from the
        head of the index (slower, never wrong)."""
        while not stop.is_set():
            try:
                self.due.at = await inbox.due_from(self._pool)
            except Exception as exc:  # the database is failing: the consumers say so themselves
                self.due.at = None
                held = _WARN.allow("due_from", asyncio.get_running_loop().time())
                if held is not None:
                    log.info("claim bound not read: %s%s", type(exc).__name__, _WARN.suffix(held))
            if await sleep_unless_stopped(stop, DUE_FROM_S):
                break

    async def _listen(self, stop: asyncio.Event) -> None:
        """Wake the consumers on NOTIFY (polling covers the gaps)."""
        assert self._s.database_url
        opener = functools.partial(own_connection, self._s.database_url, self._s.db_connect_timeout_s)
        await listen(opener, inbox.CHANNEL, self._wake_one, stop, liveness_s=self._s.liveness_s)
