"""Fresh outbox rows of concurrent requests in one INSERT and one COMMIT.

A Graph-compatible request without an Idempotency-Key or a quoted reply is one new row under a
fresh key, nothing else. Written one by one, each such row would cost a pool connection (acquire,
and a reset round trip on release) and a commit and WAL flush of its own: about half of the HTTP
worker's CPU per request. Here the rows staged during one pass of the event loop go as one
statement on a connection this batcher owns, and the senders are woken once per batch; while a
batch is being written the next rows wait for it (or take a second connection), so batches grow
exactly when the database is the bottleneck and an idle one costs a request no wait.

A batch that fails (the database down, a statement past ``timeout_s``) fails each of its
requests with the error, as the single INSERT did: the caller answers 503. Its connection is
dropped, and the next batch opens another.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

import asyncpg

from gateway.core.errors import describe
from gateway.core.limits import LogThrottle
from gateway.store import outbox

log = logging.getLogger(__name__)
_WARN = LogThrottle(10.0)

Connect = Callable[[], Awaitable[asyncpg.Connection]]
_Staged = tuple[outbox.NewMessage, asyncio.Future[outbox.OutboxRow]]


class EnqueueBatcher:
    """``await enqueue(message)``: its new row once committed; ``on_commit()`` after each
    batch's commit (the senders' wake)."""

    def __init__(
        self,
        connect: Connect,
        on_commit: Callable[[], None] = lambda: None,
        *,
        max_batch: int = 256,
        max_inflight: int = 2,
        timeout_s: float = 60.0,
    ) -> None:
        self._connect = connect
        self._on_commit = on_commit
        self._max_batch = max_batch
        self._max_inflight = max_inflight
        self._timeout_s = timeout_s  # as the pool's command timeout
        self._pending: list[_Staged] = []
        self._idle: list[asyncpg.Connection] = []
        self._inflight = 0
        self._scheduled = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self.batches = 0  # written, for tests and benchmarks

    async def enqueue(self, m: outbox.NewMessage) -> outbox.OutboxRow:
        if self._closed:
            raise ConnectionError("the gateway is stopping")
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[outbox.OutboxRow] = loop.create_future()
        self._pending.append((m, fut))
        if not self._scheduled and self._inflight < self._max_inflight:
            # At the end of this pass: the requests read in it share the batch.
            self._scheduled = True
            loop.call_soon(self._flush)
        return await fut

    def _flush(self) -> None:
        self._scheduled = False
        while self._pending and self._inflight < self._max_inflight:
            batch = self._pending[: self._max_batch]
            del self._pending[: self._max_batch]
            self._inflight += 1
            task = asyncio.get_running_loop().create_task(self._write(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _write(self, batch: list[_Staged]) -> None:
        conn = self._idle.pop() if self._idle else None
        try:
            async with asyncio.timeout(self._timeout_s):
                if conn is None or conn.is_closed():
                    conn = await self._connect()
                rows = await outbox.enqueue_batch(conn, [m for m, _ in batch])
        except BaseException as exc:
            if conn is not None:
                conn.terminate()  # cancelled mid-statement, or broken: its state is unknown
                conn = None
            held = _WARN.allow("write", time.monotonic())
            if held is not None:
                log.warning("%d sends not enqueued: %s%s", len(batch), describe(exc), _WARN.suffix(held))
            failed = exc if isinstance(exc, Exception) else ConnectionError("the gateway is stopping")
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(failed)
            if not isinstance(exc, Exception):
                raise
        else:
            self.batches += 1
            for m, fut in batch:
                if fut.done():
                    continue  # its request went away; the row stands, as a single INSERT's would
                row = rows.get((m.tenant, m.key))
                if row is None:
                    fut.set_exception(RuntimeError("a fresh key found a row"))
                else:
                    fut.set_result(row)
            self._on_commit()  # in this pass, before the requests resume: once per batch
        finally:
            if conn is not None:
                self._idle.append(conn)
            self._inflight -= 1
            if self._pending and not self._scheduled:
                self._flush()

    async def close(self) -> None:
        """Take no more rows; write those staged and wait for every batch."""
        self._closed = True
        while self._pending or self._tasks:
            self._flush()
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        idle, self._idle = self._idle, []
        await asyncio.gather(*(c.close(timeout=2) for c in idle), return_exceptions=True)
