"""Waiting for a send's outcome: the Graph-compatible endpoint answers with Meta's JSON, so it
waits (up to ``GATEWAY_GRAPH_COMPAT_WAIT_MS``) for the sender, which may run in another process.

Every change of state of a row that a request waits for is announced by the database (NOTIFY
``outbox_outcome``, payload ``<id> <state> <wamid>``: sql/functions/outbox_outcome_notify.sql),
whichever process changed it. Each process keeps one LISTEN connection; a waiting request
registers before it reads its row (a change after the read is heard, one before it is seen), then
sleeps until a final state is announced or its wait ends, and looks at the row once more at the
end (a notification lost with a dropped connection costs latency, never the answer). When the
LISTEN connection is re-established, every waiter looks again.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from gateway.core.settings import Settings
from gateway.store.listen import listen, own_connection

log = logging.getLogger(__name__)

CHANNEL = "outbox_outcome"
# States that end a wait: the send's fate is settled, or left to the reconciler or a person.
FINAL = frozenset({"accepted", "failed", "unknown", "review", "cancelled"})


@dataclass(frozen=True, slots=True)
class Outcome:
    state: str
    wamid: str | None

    @property
    def final(self) -> bool:
        return self.state in FINAL


def parse(payload: str) -> tuple[int, Outcome] | None:
    """``<id> <state> <wamid>`` (the wamid empty until known); None for anything else."""
    parts = payload.split(" ", 2)
    if len(parts) != 3 or not (parts[0].isascii() and parts[0].isdigit()):
        return None
    return int(parts[0]), Outcome(parts[1], parts[2] or None)


class OutcomeWaiter:
    """The process's waiters and its LISTEN connection (``run`` until stopped)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._waiting: dict[int, set[asyncio.Future[Outcome | None]]] = {}

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
        if outcome.final:
            self._resolve(self._waiting.get(row_id, ()), outcome)

    def _look_again(self) -> None:
        """(Re)connected: what happened meanwhile was not heard; every waiter reads its row."""
        for futures in self._waiting.values():
            self._resolve(futures, None)

    @staticmethod
    def _resolve(futures: set[asyncio.Future[Outcome | None]] | tuple[()], value: Outcome | None) -> None:
        for fut in list(futures):
            if not fut.done():
                fut.set_result(value)

    async def wait(
        self,
        row_id: int,
        timeout_s: float,
        read: Callable[[], Awaitable[Outcome | None]],
        known: Outcome | None = None,
    ) -> Outcome | None:
        """The row's outcome once final, or its state when ``timeout_s`` ends (None: no row).
        ``read`` looks at the row in the database. ``known``: the row's state as its request just
        wrote it (the first read is saved; a change announced in the moment between that write
        and this call is caught by the last look at the end of the wait)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        futures = self._waiting.setdefault(row_id, set())
        fut: asyncio.Future[Outcome | None] = loop.create_future()
        futures.add(fut)
        try:
            current = known if known is not None else await read()
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
