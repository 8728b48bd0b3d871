"""Waiting for a send's outcome: the Graph-compatible endpoint answers with Meta's JSON, so it
waits (up to ``GATEWAY_GRAPH_COMPAT_WAIT_MS``) for the sender, which may run in another process.

Every state that ends a wait, of a row a request waits for, is announced by the database
(NOTIFY ``outbox_outcome``, payload ``<id> <state> <wamid>``:
sql/functions/outbox_outcome_notify.sql), whichever process made it. Each process has one
LISTEN connection (while such requests come: below); a waiting request registers before it
reads its row (a change after the read is heard, one before it is seen), then sleeps until a
final state is announced or its wait ends, and looks at the row once more at the end (a
notification lost with a dropped connection costs latency, never the answer). When the LISTEN
connection is re-established, every waiter looks again.

A request that has just created its row skips that first read, so an outcome announced between
its commit and its registration (the sender was quicker than the request's own return to the
event loop, which under load is the common case) would otherwise be found only by the last look,
a whole wait later. Final outcomes that nobody here waited for are therefore kept for a while
(``RECENT_S``, at most ``RECENT_MAX``), and a new row's wait starts by looking there: ids are
never reused, so whatever was announced for a row created by this request is its outcome.

The LISTEN connection is up only while Graph-compatible requests come: a request makes sure of
it (``ready``) before it creates its row, and it is closed after ``IDLE_S`` without one. A
NOTIFY wakes every backend that listens in the database, whatever its channel (PostgreSQL 18's
``SignalBackends`` in src/backend/commands/async.c signals each of them to read the queue), so
an idle listener in each HTTP worker would cost the database a wake-up per batch of webhooks and
per delivery round, for nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from gateway.core.aio import first_set, wait_set
from gateway.core.settings import Settings
from gateway.store.listen import listen, own_connection

log = logging.getLogger(__name__)

CHANNEL = "outbox_outcome"
# States that end a wait: the send's fate is settled, or left to the reconciler or a person.
FINAL = frozenset({"accepted", "failed", "unknown", "review", "cancelled"})
# Outcomes heard before their request waited: kept this long, and this many at most (the last
# ones; every process hears every Graph-compatible row's outcome).
RECENT_S = 30.0
RECENT_MAX = 50_000
# The LISTEN is closed after this long without a Graph-compatible request (none waiting).
IDLE_S = 300.0
# The longest a request waits for the LISTEN to come up before it goes on without it: its
# wait's last look at the row finds an outcome that nobody announced to it.
READY_S = 2.0


@dataclass(frozen=True, slots=True)
class OutboxOutcome:
    state: str
    wamid: str | None

    @property
    def final(self) -> bool:
        return self.state in FINAL


def parse(payload: str) -> tuple[int, OutboxOutcome] | None:
    """``<id> <state> <wamid>`` (the wamid empty until known); None for anything else."""
    parts = payload.split(" ", 2)
    if len(parts) != 3 or not (parts[0].isascii() and parts[0].isdigit()):
        return None
    return int(parts[0]), OutboxOutcome(parts[1], parts[2] or None)


class OutcomeWaiter:
    """The process's waiters and its LISTEN connection (``run`` until stopped)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._waiting: dict[int, set[asyncio.Future[OutboxOutcome | None]]] = {}
        # Row id -> (when heard, outcome), oldest first.
        self._recent: OrderedDict[int, tuple[float, OutboxOutcome]] = OrderedDict()
        self.clock: Callable[[], float] = time.monotonic
        self.idle_s = IDLE_S
        self._asked = -IDLE_S  # when a request last made sure of the LISTEN (``clock``)
        self._want = asyncio.Event()  # a request waits for the LISTEN to come up
        self._up = asyncio.Event()  # the LISTEN is registered
        self._down = asyncio.Event()  # the last try to listen failed, or its session was lost

    @property
    def waiting(self) -> int:
        return sum(len(f) for f in self._waiting.values())

    @property
    def listening(self) -> bool:
        return self._up.is_set()

    async def ready(self, within: float = READY_S) -> None:
        """Before a request creates a row it will wait for: the LISTEN is up (opened, if it was
        not). The request goes on without it once a try to open it has failed (at once while
        the database cannot be reached: its own writes will tell) or after ``within``."""
        self._asked = self.clock()
        if not (self._up.is_set() or self._down.is_set()):
            self._want.set()
            await first_set(self._up, self._down, within=within)

    async def run(self, stop: asyncio.Event) -> None:
        """Listen while requests want it (``ready``), until ``stop``."""
        dsn = self.settings.database_url
        assert dsn, "the database is resolved before the app starts"
        opener = functools.partial(own_connection, dsn, self.settings.db_connect_timeout_s)
        liveness_s = self.settings.liveness_s
        while not stop.is_set():
            await first_set(stop, self._want)
            if stop.is_set():
                return
            self._want.clear()
            quiet = asyncio.Event()
            task = asyncio.create_task(
                listen(
                    opener,
                    CHANNEL,
                    self._connected,
                    quiet,
                    on_payload=self._heard,
                    on_down=self._lost,
                    liveness_s=liveness_s,
                )
            )
            try:
                await self._until_idle(stop)
            finally:
                self._up.clear()
                self._down.clear()
                quiet.set()
                try:
                    await task
                except asyncio.CancelledError:
                    task.cancel()
                    raise

    async def _until_idle(self, stop: asyncio.Event) -> None:
        """Until ``stop``, or ``idle_s`` since the last request that asked with none waiting."""
        while not stop.is_set():
            left = self._asked + self.idle_s - self.clock()
            if left <= 0 and not self._waiting:
                return
            await wait_set(stop, max(left, 1.0))

    def _connected(self) -> None:
        """The LISTEN is registered, at first or again."""
        self._down.clear()
        self._up.set()
        self._look_again()

    def _lost(self) -> None:
        self._up.clear()
        self._down.set()

    def _heard(self, payload: str) -> None:
        found = parse(payload)
        if found is None:
            return
        row_id, outcome = found
        if not outcome.final:
            return
        futures = self._waiting.get(row_id)
        if futures:
            self._resolve(futures, outcome)
        else:
            self._remember(row_id, outcome)

    def _remember(self, row_id: int, outcome: OutboxOutcome) -> None:
        now = self.clock()
        recent = self._recent
        recent[row_id] = (now, outcome)
        recent.move_to_end(row_id)
        while recent and (len(recent) > RECENT_MAX or next(iter(recent.values()))[0] < now - RECENT_S):
            recent.popitem(last=False)

    def _look_again(self) -> None:
        """(Re)connected: what happened meanwhile was not heard; every waiter reads its row."""
        for futures in self._waiting.values():
            self._resolve(futures, None)

    @staticmethod
    def _resolve(
        futures: set[asyncio.Future[OutboxOutcome | None]] | tuple[()], value: OutboxOutcome | None
    ) -> None:
        for fut in list(futures):
            if not fut.done():
                fut.set_result(value)

    async def wait(
        self,
        row_id: int,
        timeout_s: float,
        read: Callable[[], Awaitable[OutboxOutcome | None]],
        known: OutboxOutcome | None = None,
    ) -> OutboxOutcome | None:
        """The row's outcome once final, or its state when ``timeout_s`` ends (None: no row).
        ``read`` looks at the row in the database. ``known``: the state of a row its request just
        created (the first read is saved; an outcome announced between that write and this call
        was kept for it)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        futures = self._waiting.setdefault(row_id, set())
        fut: asyncio.Future[OutboxOutcome | None] = loop.create_future()
        futures.add(fut)
        try:
            current: OutboxOutcome | None
            if known is not None:
                early = self._recent.pop(row_id, None)
                current = early[1] if early is not None else known
            else:
                current = await read()
            while current is not None and not current.final:
                left = deadline - loop.time()
                if left <= 0:
                    break
                done, _ = await asyncio.wait({fut}, timeout=left)
                if not done:
                    return await read()  # the last look: a notification may have been lost
                heard = fut.result()
                futures.discard(fut)
                fut = loop.create_future()
                futures.add(fut)
                current = heard if heard is not None else await read()
            return current
        finally:
            futures.discard(fut)
            if not futures and self._waiting.get(row_id) is futures:
                del self._waiting[row_id]


@contextlib.asynccontextmanager
async def running(waiter: OutcomeWaiter) -> AsyncIterator[None]:
    """Listen for the block's duration."""
    stop = asyncio.Event()
    task = asyncio.create_task(waiter.run(stop))
    try:
        yield
    finally:
        stop.set()
        with contextlib.suppress(asyncio.CancelledError, TimeoutError):
            await asyncio.wait_for(task, 5)
