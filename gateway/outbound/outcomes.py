"""Waiting for a send's outcome: the Graph-compatible endpoint answers with Meta's JSON, so it
waits (up to ``GATEWAY_GRAPH_COMPAT_WAIT_MS``) for the sender, which may run in another process.

Every state that ends a wait, of a row a request waits for, is announced by the database
(NOTIFY ``outbox_outcome``, payload ``<id> <state> <wamid>``:
sql/functions/outbox_outcome_notify.sql), whichever process made it. Each process keeps one
LISTEN connection; a waiting request registers before it reads its row (a change after the read
is heard, one before it is seen), then sleeps until a final state is announced or its wait ends,
and looks at the row once more at the end (a notification lost with a dropped connection costs
latency, never the answer). When the LISTEN connection is re-established, every waiter looks
again.

A request that has just created its row skips that first read, so an outcome announced between
its commit and its registration (the sender was quicker than the request's own return to the
event loop, which under load is the common case) would otherwise be found only by the last look,
a whole wait later. Final outcomes that nobody here waited for are therefore kept for a while
(``RECENT_S``, at most ``RECENT_MAX``), and a new row's wait starts by looking there: ids are
never reused, so whatever was announced for a row created by this request is its outcome.
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

    @property
    def waiting(self) -> int:
        return sum(len(f) for f in self._waiting.values())

    async def run(self, stop: asyncio.Event) -> None:
        dsn = self.settings.database_url
        assert dsn, "the database is resolved before the app starts"
        opener = functools.partial(own_connection, dsn, self.settings.db_connect_timeout_s)
        liveness_s = self.settings.liveness_s
        await listen(opener, CHANNEL, self._look_again, stop, on_payload=self._heard, liveness_s=liveness_s)

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
