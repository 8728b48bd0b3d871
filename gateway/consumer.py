"""Consumers: claim staged webhook rows and act on each event exactly once.

A batch costs a constant number of statements whatever its size: one claim
(``FOR UPDATE SKIP LOCKED``) and one ``apply_batch`` that inserts every key into
``processed_webhook_events`` and applies side effects only for the keys it newly
inserted, then COMMIT. If that batch fails, its rows are retried one per transaction so
one poisoned event neither blocks nor rolls back the rest; a failing row is retried with
backoff and parked as dead after ``max_attempts``. A body we cannot parse is parked at once.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import random
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import asyncpg
from aiohttp import web

from gateway import metrics, retention
from gateway.backoff import backoff_delay
from gateway.cli import command, run_worker
from gateway.db import connect
from gateway.events import AccountError, AccountUpdate, Event, InboundMessage, PayloadError, Status, parse
from gateway.settings import Settings
from gateway.sqlfiles import q

log = logging.getLogger(__name__)

INBOX_CHANNEL = "webhook_inbox"
MAX_ERROR_CHARS = 2000
Conn = asyncpg.Connection | asyncpg.pool.PoolConnectionProxy
Row = Mapping[str, Any] | asyncpg.Record
LAG_INTERVAL_S = 5.0


@dataclass
class Plan:
    """What one batch of staged rows asks of the database (built without I/O)."""

    keys: list[str] = field(default_factory=list)
    key_inbox: list[int] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    statuses: list[dict[str, Any]] = field(default_factory=list)
    account_errors: list[dict[str, Any]] = field(default_factory=list)
    account_updates: list[dict[str, Any]] = field(default_factory=list)
    done: list[int] = field(default_factory=list)
    parked: list[int] = field(default_factory=list)
    parked_why: list[str] = field(default_factory=list)
    duplicates_in_batch: int = 0
    kinds: Counter[str] = field(default_factory=Counter)

    def params(self) -> tuple[Any, ...]:
        return (
            self.keys,
            self.key_inbox,
            self.messages,
            self.statuses,
            self.account_errors,
            self.account_updates,
            self.done,
            self.parked,
            self.parked_why,
        )


def _add(plan: Plan, ev: Event, inbox_id: int, source: str) -> None:
    plan.keys.append(ev.key)
    plan.key_inbox.append(inbox_id)
    plan.kinds[ev.kind] += 1
    if isinstance(ev, InboundMessage):
        plan.messages.append(
            {
                "key": ev.key,
                "source": source,
                "wamid": ev.wamid,
                "phone_number_id": ev.phone_number_id,
                "sender": ev.sender,
                "type": ev.type,
                "ts": ev.timestamp,
                "contact_name": ev.contact_name,
                "message": ev.message,
                "inbox_id": inbox_id,
            }
        )
    elif isinstance(ev, Status):
        plan.statuses.append(
            {
                "key": ev.key,
                "source": source,
                "wamid": ev.wamid,
                "status": ev.status,
                "participant": ev.participant,
                "recipient": ev.recipient,
                "ts": ev.timestamp,
                "callback_data": ev.callback_data,
                "errors": ev.errors,
                "raw": ev.raw,
                "inbox_id": inbox_id,
            }
        )
    elif isinstance(ev, AccountError):
        plan.account_errors.append(
            {
                "key": ev.key,
                "waba_id": ev.waba_id,
                "phone_number_id": ev.phone_number_id,
                "field": ev.field,
                "errors": ev.errors,
                "raw": ev.raw,
                "inbox_id": inbox_id,
            }
        )
    elif isinstance(ev, AccountUpdate):
        plan.account_updates.append(
            {"key": ev.key, "waba_id": ev.waba_id, "field": ev.field, "value": ev.value, "inbox_id": inbox_id}
        )


def plan_batch(rows: Iterable[Row]) -> Plan:
    """Parse every row; park the unparseable; keep the first occurrence of each key."""
    plan = Plan()
    seen: set[str] = set()
    for row in rows:
        inbox_id = int(row["id"])
        try:
            events = parse(row["source"], bytes(row["body"]), row["delivery_id"])
        except PayloadError as exc:
            plan.parked.append(inbox_id)
            plan.parked_why.append(f"{type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS])
            continue
        plan.done.append(inbox_id)
        for ev in events:
            if ev.key in seen:
                plan.duplicates_in_batch += 1
                continue
            seen.add(ev.key)
            _add(plan, ev, inbox_id, row["source"])
    return plan


def _setter(event: asyncio.Event) -> Callable[[Any], None]:
    return lambda _conn: event.set()


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS]


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
                    rows = await conn.fetch(
                        q("claim_inbox_batch"), self._s.consumer_batch, self._s.consumer_batch_bytes
                    )
                    if not rows:
                        return 0
                    ids = [r["id"] for r in rows]
                    plan = plan_batch(rows)
                    result = await conn.fetchrow(q("apply_batch"), *plan.params())
            except Exception as exc:  # any failure: isolate the rows (a bug in one must not block all)
                if not ids or conn.is_closed():
                    raise
                metrics.CONSUMER_FALLBACKS.inc()
                log.warning("batch of %d rows failed (%s); retrying one by one", len(ids), _describe(exc))
                await self._one_by_one(conn, ids)
            else:
                assert result is not None
                self._observe(plan, result)
        metrics.CONSUMER_BATCH_ROWS.observe(len(ids))
        metrics.CONSUMER_BATCH_SECONDS.observe(time.perf_counter() - started)
        return len(ids)

    async def _one_by_one(self, conn: Conn, ids: list[int]) -> None:
        """Each row in its own transaction: the good ones commit, a bad one is retried later."""
        for inbox_id in ids:
            attempts = 0
            try:
                async with conn.transaction():
                    row = await conn.fetchrow(q("claim_inbox_row"), inbox_id)
                    if row is None:
                        continue  # taken (or finished) by another consumer meanwhile
                    attempts = row["attempts"]
                    plan = plan_batch([row])
                    result = await conn.fetchrow(q("apply_batch"), *plan.params())
            except Exception as exc:
                if conn.is_closed():
                    raise
                await self._failed(conn, inbox_id, attempts, exc)
            else:
                assert result is not None
                self._observe(plan, result)

    async def _failed(self, conn: Conn, inbox_id: int, attempts: int, exc: BaseException) -> None:
        s = self._s
        delay = backoff_delay(attempts + 1, s.retry_base_ms / 1000, s.retry_max_ms / 1000, self._rand)
        state = await conn.fetchval(q("inbox_row_failed"), inbox_id, s.max_attempts, delay, _describe(exc))
        if state == "dead":
            metrics.DEAD_LETTERS.labels("max_attempts").inc()
            log.error("inbox row %d parked as dead after %d attempts: %s", inbox_id, attempts + 1, exc)
        elif state == "pending":
            metrics.CONSUMER_FAILURES.inc()
            log.warning("inbox row %d failed (attempt %d), retry in %.1fs", inbox_id, attempts + 1, delay)

    def _observe(self, plan: Plan, result: Row) -> None:
        fresh = {
            "message": result["messages"],
            "status": result["statuses"],
            "account_error": result["account_errors"],
            "account_update": result["account_updates"],
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

    async def run(self, stop: asyncio.Event) -> None:
        poll_s = self._s.consumer_poll_ms / 1000
        while not stop.is_set():
            self.wake.clear()
            try:
                claimed = await self.process_batch()
            except Exception as exc:
                log.warning("consumer batch failed: %s", _describe(exc))
                claimed = 0
            if claimed:
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), poll_s)


class ConsumerGroup:
    """``consumer_concurrency`` consumers sharing one LISTEN connection, plus lag and retention."""

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
        self._tasks.append(loop.create_task(self._lag()))
        self._tasks.append(loop.create_task(self._purge()))

    async def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        self._wake_all()
        _done, pending = await asyncio.wait(self._tasks, timeout=timeout_s) if self._tasks else ((), ())
        for t in pending:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), seconds)

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
                await conn.add_listener(INBOX_CHANNEL, self._wake_all)
                attempt = 0
                self._wake_all()  # rows staged while we were not listening
                stop_wait = asyncio.ensure_future(self._stop.wait())
                lost_wait = asyncio.ensure_future(lost.wait())
                await asyncio.wait({stop_wait, lost_wait}, return_when=asyncio.FIRST_COMPLETED)
                stop_wait.cancel()
                lost_wait.cancel()
            except Exception as exc:
                attempt += 1
                log.warning("LISTEN %s failed (%s); polling meanwhile", INBOX_CHANNEL, _describe(exc))
            finally:
                if conn is not None and not conn.is_closed():
                    with contextlib.suppress(Exception):
                        await conn.close(timeout=2)
            if not self._stop.is_set():
                await self._sleep(backoff_delay(max(attempt, 1), 0.5, 30))

    async def _lag(self) -> None:
        while not self._stop.is_set():
            try:
                metrics.CONSUMER_LAG.set(await self._pool.fetchval(q("consumer_lag")))
            except Exception as exc:
                log.debug("lag query failed: %s", type(exc).__name__)
            await self._sleep(LAG_INTERVAL_S)

    async def _purge(self) -> None:
        while not self._stop.is_set():
            try:
                await retention.purge(self._pool, self._s, self._stop)
            except Exception as exc:
                log.warning("retention purge failed: %s", _describe(exc))
            await self._sleep(self._s.purge_interval_s)


async def consumers_ctx(app: web.Application) -> AsyncIterator[None]:
    """cleanup_ctx: consumers run for the app's lifetime, on the app's pool."""
    from gateway.appkeys import CONSUMERS, POOL, SETTINGS

    group = ConsumerGroup(app[POOL], app[SETTINGS])
    app[CONSUMERS] = group
    await group.start()
    yield
    await group.stop()


@command("consume", "run the consumers alone (no HTTP), until SIGTERM or SIGINT")
def cmd_consume(settings: Settings, ns: argparse.Namespace) -> int:
    async def work(pool: asyncpg.Pool, stop: asyncio.Event) -> None:
        group = ConsumerGroup(pool, settings)
        try:
            await group.start()
            log.info("%d consumer(s) running", settings.consumer_concurrency)
            await stop.wait()
        finally:
            await group.stop()

    return run_worker(settings, (1, settings.consumer_concurrency + 2), work)
