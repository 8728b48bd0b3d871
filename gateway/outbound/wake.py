"""Waking the senders once a send request's row is committed (and the forwarders of other
processes once a consumer's batch queued deliveries, on a Citus coordinator: ForwarderWake).

The wake is not part of the request's transaction: PostgreSQL serialises the commits of all
transactions that NOTIFY (one database-wide lock, held through the commit's WAL flush), so a
NOTIFY per request caps the requests at one per flush, and the rest queue for the pool. After
the commit instead:

- a sender running in this process (``gateway serve`` with its services inline) is woken
  directly, with no database round trip;
- otherwise one ``NOTIFY outbox`` goes out at a time, in a transaction of its own that does not
  wait for its flush (``gateway.store.outbox.wake_senders``), on a connection of its own (a pool's
  acquire and reset would cost more than the statement); requests that commit while it is under
  way share the next one, so under load the wakes cost a few statements, not one per request.
  A lost wake (the database unreachable for it) costs the senders one poll
  (``GATEWAY_SEND_POLL_MS``), never a row.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

import asyncpg

from gateway.core.errors import describe
from gateway.core.limits import LogThrottle
from gateway.store import deliveries, outbox
from gateway.store.db import DB_ERRORS, citus_state

log = logging.getLogger(__name__)
_WARN = LogThrottle(10.0)
# A wake that takes longer than this is given up: the senders' poll finds the rows.
TIMEOUT_S = 5.0


Connect = Callable[[], Awaitable[asyncpg.Connection]]


class SenderWake:
    """Call it after a commit that made a row due; it NOTIFYs on a connection from ``connect``."""

    def __init__(self, connect: Connect) -> None:
        self._connect = connect
        self._closed = False
        self._conn: asyncpg.Connection | None = None
        self._local: list[Callable[[], None]] = []
        self._task: asyncio.Task[None] | None = None
        self._again = False

    def attach(self, wake: Callable[[], None]) -> Callable[[], None]:
        """Wake this process's sender with ``wake`` instead of NOTIFY; returns the detach."""
        self._local.append(wake)
        return lambda: self._local.remove(wake)

    def __call__(self) -> None:
        if self._local:
            for wake in self._local:
                wake()
            return
        if self._closed:
            return
        if self._task is not None and not self._task.done():
            self._again = True  # the one under way may have left before this commit
            return
        self._task = asyncio.get_running_loop().create_task(self._notify(self._connect))

    async def _notify(self, connect: Connect) -> None:
        again = True
        while again:
            self._again = False
            try:
                async with asyncio.timeout(TIMEOUT_S):
                    if self._conn is None or self._conn.is_closed():
                        self._conn = await connect()
                    await outbox.wake_senders(self._conn)
            except DB_ERRORS as exc:
                if self._conn is not None:
                    self._conn.terminate()  # broken, or cancelled mid-statement
                    self._conn = None
                held = _WARN.allow("wake", time.monotonic())
                if held is not None:
                    log.warning("senders not woken (they poll): %s%s", describe(exc), _WARN.suffix(held))
                return
            again = self._again

    async def close(self) -> None:
        """Let the wake under way finish, and close the connection."""
        self._closed = True
        if self._task is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._task, TIMEOUT_S)
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await self._conn.close(timeout=2)
            self._conn = None


class ForwarderWake:
    """Call it after a consumer's commit that queued deliveries: wakes this process's forwarder
    (``local``) at once, and on a Citus coordinator the forwarders of other processes too, one
    ``NOTIFY deliveries`` at a time from ``pool`` (calls while one is under way share the next).
    On one PostgreSQL the trigger ``deliveries_notify`` has said it in the consumer's own
    transaction; on Citus no trigger can (a worker's NOTIFY reaches no listener,
    sql/citus/layout.sql), so the consumer's process says it after the commit. Which one the
    database is, is asked once. A lost wake costs the forwarders one poll. ``woken`` names the
    local forwarder (``Forwarder.token``): the consumers' transactions carry it
    (``deliveries.woken_by``), so that it skips the NOTIFY of a commit it was woken for."""

    def __init__(
        self, pool: asyncpg.Pool, local: Callable[[], None] | None = None, woken: str = ""
    ) -> None:
        self._pool = pool
        self._local = local
        self.woken = woken
        self._citus: bool | None = None
        self._task: asyncio.Task[None] | None = None
        self._again = False

    def __call__(self) -> None:
        if self._local is not None:
            self._local()
        if self._citus is False:
            return
        if self._task is not None and not self._task.done():
            self._again = True
            return
        self._task = asyncio.get_running_loop().create_task(self._notify())

    async def _notify(self) -> None:
        again = True
        while again:
            self._again = False
            try:
                async with asyncio.timeout(TIMEOUT_S):
                    if self._citus is None:
                        self._citus = (await citus_state(self._pool))[0]
                    if not self._citus:
                        return
                    await deliveries.wake_forwarders(self._pool, self.woken)
            except DB_ERRORS as exc:
                held = _WARN.allow("forwarders", time.monotonic())
                if held is not None:
                    log.warning("forwarders not woken (they poll): %s%s", describe(exc), _WARN.suffix(held))
                return
            again = self._again

    async def close(self) -> None:
        if self._task is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._task, TIMEOUT_S)
