"""Group commit: rows from concurrent requests share one INSERT and one COMMIT.

A batch is cut when it reaches ``max_batch`` rows or ``window`` seconds after its first
row, whichever comes first. While ``max_inflight`` batches are being written the next
one keeps growing, so batches get bigger exactly when the database is the bottleneck.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

import asyncpg

from gateway import metrics
from gateway.sqlfiles import q

log = logging.getLogger(__name__)


class Unavailable(Exception):
    """The row could not be committed (database down, or the committer is closed)."""


@dataclass(slots=True)
class _Item:
    source: str
    body: bytes
    delivery_id: str | None
    future: asyncio.Future[int] = field(repr=False)


def _retrieve(fut: asyncio.Future[int]) -> None:
    if not fut.cancelled():
        fut.exception()


class GroupCommitter:
    def __init__(
        self,
        pool: asyncpg.Pool,
        *,
        window_s: float = 0.002,
        max_batch: int = 256,
        max_inflight: int = 4,
        acquire_timeout_s: float = 5.0,
    ) -> None:
        self._pool = pool
        self._window = window_s
        self._max_batch = max_batch
        self._max_inflight = max_inflight
        self._acquire_timeout = acquire_timeout_s
        self._pending: list[_Item] = []
        self._timer: asyncio.TimerHandle | None = None
        self._inflight = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self._sql = q("insert_inbox_batch")
        self.batches_written = 0

    @property
    def pending(self) -> int:
        """Rows waiting for a batch to be cut."""
        return len(self._pending)

    def stage(self, source: str, body: bytes, delivery_id: str | None = None) -> asyncio.Future[int]:
        """Queue one row; the future resolves to its id after COMMIT, or raises Unavailable."""
        if self._closed:
            raise Unavailable("shutting down")
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        # A request that gave up at its deadline never reads the outcome: mark it read.
        fut.add_done_callback(_retrieve)
        self._pending.append(_Item(source, body, delivery_id, fut))
        if len(self._pending) >= self._max_batch:
            self._flush()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._window, self._flush)
        return fut

    def _flush(self, force: bool = False) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        while self._pending and (force or self._inflight < self._max_inflight):
            batch = self._pending[: self._max_batch]
            del self._pending[: self._max_batch]
            self._inflight += 1
            task = asyncio.get_running_loop().create_task(self._write(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _write(self, batch: list[_Item]) -> None:
        started = time.perf_counter()
        try:
            async with self._pool.acquire(timeout=self._acquire_timeout) as conn:
                rows = await conn.fetch(
                    self._sql,
                    [i.source for i in batch],
                    [i.body for i in batch],
                    [i.delivery_id for i in batch],
                )
        except Exception as exc:  # any failure: nobody in this batch may get a 200
            metrics.COMMIT_FAILURES.inc()
            log.warning("group commit of %d rows failed: %s", len(batch), type(exc).__name__)
            for item in batch:
                if not item.future.done():
                    item.future.set_exception(Unavailable(type(exc).__name__))
        else:
            self.batches_written += 1
            metrics.COMMIT_BATCH_SIZE.observe(len(batch))
            metrics.COMMIT_SECONDS.observe(time.perf_counter() - started)
            for item, row in zip(batch, rows, strict=True):
                if not item.future.done():
                    item.future.set_result(row[0])
        finally:
            self._inflight -= 1
            # Rows that queued behind this batch have waited one commit already.
            if self._pending and not self._closed:
                self._flush()

    async def close(self) -> None:
        """Stop taking rows, write what is pending, and wait for every batch."""
        self._closed = True
        self._flush(force=True)
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
