"""Consumers: claim staged webhook rows and act on each event exactly once.

A batch costs a constant number of statements whatever its size: one claim
(``FOR UPDATE SKIP LOCKED``) and one statement that inserts every key into
``processed_webhook_events`` and applies side effects only for the keys it newly
inserted, then COMMIT. If that batch fails, its rows are retried one per transaction so
one poisoned event neither blocks nor rolls back the rest; a failing row is retried with
backoff and parked as dead after ``max_attempts``. A body we cannot parse is parked at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable
from typing import Any

import asyncpg

from gateway import metrics, tracing
from gateway.core.aio import sleep_unless_stopped
from gateway.core.backoff import backoff_delay
from gateway.core.enums import InboxState
from gateway.core.limits import LogThrottle
from gateway.core.planning import Plan, describe, plan_batch
from gateway.core.settings import Settings
from gateway.store import inbox
from gateway.store.db import Conn, connect

log = logging.getLogger(__name__)
# A database outage fails every batch and row alike: at most one line per kind per 10 s.
_WARN = LogThrottle(10.0)


def _warn(kind: str, msg: str, *args: object) -> None:
    held = _WARN.allow(kind, time.monotonic())
    if held is not None:
        log.warning(msg + "%s", *args, _WARN.suffix(held))


class Consumer:
    """One claim-process-commit loop over ``webhook_inbox``."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        settings: Settings,
        *,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self._pool = pool
        self._s = settings
        self._rand = rand
        self.wake = asyncio.Event()

    async def process_batch(self) -> int:
        """Claim one batch of due rows and handle it; returns the rows claimed (0: none due)."""
        started = time.perf_counter()
        async with self._pool.acquire() as conn:
            ids: list[int] = []
            try:
                async with conn.transaction():
                    rows = await inbox.claim_batch(
                        conn, limit=self._s.consumer_batch, max_bytes=self._s.consumer_batch_bytes
                    )
                    if not rows:
                        return 0
                    ids = [r.id for r in rows]
                    with tracing.span("consumer.batch", rows=len(rows)):
                        plan = plan_batch(rows)
                        result = await inbox.apply_plan(conn, plan)
            except Exception as exc:  # any failure: isolate the rows (a bug in one must not block all)
                if not ids or conn.is_closed():
                    raise
                metrics.CONSUMER_FALLBACKS.inc()
                _warn(
                    "fallback", "batch of %d rows failed (%s); retrying one by one", len(ids), describe(exc)
                )
                await self._one_by_one(conn, ids)
            else:
                _observe(plan, result)
        metrics.CONSUMER_BATCH_ROWS.observe(len(ids))
        metrics.CONSUMER_BATCH_SECONDS.observe(time.perf_counter() - started)
        return len(ids)

    async def _one_by_one(self, conn: Conn, ids: list[int]) -> None:
        """Each row in its own transaction: the good ones commit, a bad one is retried later."""
        for inbox_id in ids:
            attempts = 0
            try:
                async with conn.transaction():  # type: ignore[union-attr]
                    row = await inbox.claim_row(conn, inbox_id=inbox_id)
                    if row is None:
                        continue  # taken (or finished) by another consumer meanwhile
                    attempts = row.attempts
                    plan = plan_batch([row])
                    result = await inbox.apply_plan(conn, plan)
            except Exception as exc:
                if conn.is_closed():  # type: ignore[union-attr]
                    raise
                await self._failed(conn, inbox_id, attempts, exc)
            else:
                _observe(plan, result)

    async def _failed(self, conn: Conn, inbox_id: int, attempts: int, exc: BaseException) -> None:
        s = self._s
        delay = backoff_delay(attempts + 1, s.retry_base_ms / 1000, s.retry_max_ms / 1000, self._rand)
        state = await inbox.row_failed(
            conn, inbox_id=inbox_id, max_attempts=s.max_attempts, delay_s=delay, error=describe(exc)
        )
        if state is InboxState.DEAD:
            metrics.DEAD_LETTERS.labels("max_attempts").inc()
            log.error("inbox row %d parked as dead after %d attempts: %s", inbox_id, attempts + 1, exc)
        elif state is InboxState.PENDING:
            metrics.CONSUMER_FAILURES.inc()
            _warn("row", "inbox row %d failed (attempt %d), retry in %.1fs", inbox_id, attempts + 1, delay)

    async def run(self, stop: asyncio.Event) -> None:
        poll_s = self._s.consumer_poll_ms / 1000
        while not stop.is_set():
            self.wake.clear()
            try:
                claimed = await self.process_batch()
            except Exception as exc:
                _warn("batch", "consumer batch failed: %s", describe(exc))
                claimed = 0
            if claimed:
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), poll_s)


def _observe(plan: Plan, result: inbox.Applied) -> None:
    fresh = {
        "message": result.messages,
        "status": result.statuses,
        "account_error": result.account_errors,
        "account_update": result.account_updates,
    }
    duplicates = plan.duplicates_in_batch
    for kind, total in plan.kinds.items():
        new = fresh.get(kind, 0)
        metrics.CONSUMER_EVENTS.labels(kind, "processed").inc(new)
        metrics.CONSUMER_EVENTS.labels(kind, "duplicate").inc(total - new)
        duplicates += total - new
    metrics.CONSUMER_DUPLICATES.inc(duplicates)
    if plan.parked:
        metrics.DEAD_LETTERS.labels("unparseable").inc(len(plan.parked))
        for inbox_id, why in zip(plan.parked, plan.parked_why, strict=True):
            log.error("inbox row %d parked as dead: %s", inbox_id, why)


def _setter(event: asyncio.Event) -> Callable[[Any], None]:
    return lambda _conn: event.set()


class ConsumerGroup:
    """``consumer_concurrency`` consumers sharing one LISTEN connection."""

    def __init__(self, pool: asyncpg.Pool, settings: Settings) -> None:
        self._pool = pool
        self._s = settings
        self.consumers = [Consumer(pool, settings) for _ in range(settings.consumer_concurrency)]
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
                conn.add_termination_listener(_setter(lost))
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
