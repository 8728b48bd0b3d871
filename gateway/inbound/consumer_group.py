"""A process's consumers: ``consumer_concurrency`` loops sharing the process's lanes (leased on a
connection of the group's own, ``gateway.inbound.lanes``) and one LISTEN connection, which
wakes one idle consumer per NOTIFY (a service: gateway.runtime.services)."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from typing import Any

import asyncpg

from gateway.core.aio import first_set
from gateway.core.errors import describe
from gateway.core.lanes import LaneSet
from gateway.core.limits import LogThrottle
from gateway.core.settings import Settings
from gateway.handlers import Registry
from gateway.handlers import load as load_handlers
from gateway.inbound.consumer import Consumer, consumer_spacing
from gateway.inbound.lanes import LaneLease
from gateway.store import inbox
from gateway.store.db import connect
from gateway.store.listen import listen, own_connection

log = logging.getLogger(__name__)
_WARN = LogThrottle(60.0)


class ConsumerGroup:
    """``consumer_concurrency`` consumers sharing one LISTEN connection."""

    name = "consumers"
    # After a stop, a batch in progress may finish; one still running then is cancelled, and
    # its transaction rolled back leaves its rows due for the next consumer.
    stop_grace_s: float | None = 10.0

    def __init__(
        self,
        pool: asyncpg.Pool,
        settings: Settings,
        handlers: Registry | None = None,
        *,
        on_deliveries: Callable[[], None] | None = None,
        woken: str = "",
    ) -> None:
        """``on_deliveries`` is called after each committed batch that inserted deliveries (an
        in-process forwarder's wake-up, ``woken`` its token; other processes' forwarders are
        woken by NOTIFY)."""
        self._pool = pool
        self._s = settings
        if handlers is None and settings.handlers:
            handlers = load_handlers(settings.handlers)  # an import error stops the start-up
        spacing = consumer_spacing(settings)
        self.lanes = LaneSet()
        self.lease = LaneLease(settings, self.lanes)
        # Set by NOTIFY webhook_inbox 'lanes' (a member came or went, lanes were let go): the
        # lease is renewed at once instead of at its next third.
        self._lanes_changed = asyncio.Event()
        n = settings.consumer_concurrency
        self.consumers = [
            Consumer(
                pool,
                settings,
                handlers=handlers,
                spacing=spacing,
                lanes=self.lanes,
                member=self.lease.member,
                loops=n,
                on_more=self._wake_one,
                on_deliveries=on_deliveries,
                woken=woken,
            )
            for _ in range(n)
        ]

    def _wake_all(self, *_: Any) -> None:
        for c in self.consumers:
            c.wake()

    def _wake_one(self, *_: Any) -> None:
        """A NOTIFY (or a batch that left more due): one idle consumer claims. Waking them all
        had every consumer but one claim nothing, half the batches under load, each a
        transaction and a look at the dead items for nothing. When none is idle, each looks
        again after its batch. One woken whose batch has not started yet (``Consumer.starting``:
        it may be waiting for its turn) will claim what was announced: none is woken for it."""
        if any(c.starting for c in self.consumers):
            return
        if not any(c.wake_if_idle() for c in self.consumers):  # stops at the first woken
            self._wake_all()

    async def run(self, stop: asyncio.Event) -> None:
        """Consume until ``stop`` is set; then each consumer finishes its batch, and the lanes
        are let go for the other processes' consumers."""
        done = asyncio.Event()
        loops = [asyncio.create_task(c.run(stop)) for c in self.consumers]
        listener = asyncio.create_task(self._listen(stop))
        aides = [listener, asyncio.create_task(self._hold_lanes(done))]
        stopped = asyncio.create_task(stop.wait())
        stopped.add_done_callback(self._wake_all)  # idle consumers wait on their wake-up
        try:
            await asyncio.gather(*loops)
        finally:
            done.set()
            stopped.cancel()
            for t in loops:
                t.cancel()
            await asyncio.gather(*loops, return_exceptions=True)
            # The listener runs until stop: a loop that ended on its own (an error) ends the
            # group now, for its service to report, instead of leaving it waiting for a stop.
            listener.cancel()
            await asyncio.gather(*aides, return_exceptions=True)

    async def close(self) -> None:
        """Nothing to release: the consumers use the pool, the lease and the listener closed
        their connections."""

    async def _hold_lanes(self, done: asyncio.Event) -> None:
        """Renew this process's lanes every third of their lease, on a connection of its own
        (its backend stands for this member), until the consumers are done; then let them go."""
        assert self._s.database_url
        conn: asyncpg.Connection | None = None
        try:
            while not done.is_set():
                try:
                    if conn is None or conn.is_closed():
                        conn = await connect(self._s.database_url, timeout=self._s.db_connect_timeout_s)
                    if await self.lease.refresh(conn):
                        self._wake_all()  # lanes gained may hold a backlog
                except Exception as exc:  # the database is failing: the consumers say so themselves
                    if conn is not None:
                        conn.terminate()
                    conn = None
                    held = _WARN.allow("lanes", asyncio.get_running_loop().time())
                    if held is not None:
                        log.warning("lanes not renewed: %s%s", describe(exc), _WARN.suffix(held))
                await first_set(done, self._lanes_changed, within=self.lease.ttl / 3)
                self._lanes_changed.clear()
        finally:
            try:
                async with self._pool.acquire() as own:
                    await self.lease.leave(own)
            except Exception as exc:
                log.info("lanes not let go (they expire): %s", describe(exc))
            if conn is not None:
                conn.terminate()

    async def _listen(self, stop: asyncio.Event) -> None:
        """Wake the consumers on NOTIFY (polling covers the gaps)."""
        assert self._s.database_url
        opener = functools.partial(own_connection, self._s.database_url, self._s.db_connect_timeout_s)
        await listen(
            opener, inbox.CHANNEL, self._wake_one, stop, self._on_payload, liveness_s=self._s.liveness_s
        )

    def _on_payload(self, payload: str) -> None:
        if payload == inbox.LANES_CHANGED:
            self._lanes_changed.set()
        else:
            self._wake_one()
