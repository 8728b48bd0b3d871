"""The sender worker: claims due outbox rows, paces them, sends them and records the outcome.

Rows are claimed in one statement (``pending`` → ``sending``, SKIP LOCKED), so any number of
senders share the table and each row is sent by one of them. What an outcome means is decided
by ``gateway.core.classify``; pacing by ``gateway.core.pacing``; both pure. Time comes from an
injectable clock so tests can run minutes of pacing and backoff without sleeping. Reconciling
sends whose fate is unknown is ``gateway.maintenance.reconciler``'s job.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from typing import Any

import aiohttp
import asyncpg

from gateway import metrics
from gateway.core.aio import sleep_unless_stopped
from gateway.core.classify import Classified, Outcome, finalize, retry_delay_s
from gateway.core.clock import Clock, SystemClock
from gateway.core.pacing import Pacer
from gateway.core.settings import Settings
from gateway.outbound import providers
from gateway.store import outbox

log = logging.getLogger(__name__)


class Sender:
    def __init__(
        self,
        pool: asyncpg.Pool,
        settings: Settings,
        *,
        clock: Clock | None = None,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self.pool = pool
        self.settings = settings
        self.clock = clock or SystemClock()
        self.rand = rand
        self.pacer = Pacer(settings.pair_interval_s, settings.number_rate_per_s)
        self._limit = asyncio.Semaphore(settings.send_concurrency)
        self.timeout = providers.client_timeout(settings)
        self.lease_s = settings.send_lease_s
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=self.settings.send_concurrency, ttl_dns_cache=300)
            self._session = aiohttp.ClientSession(connector=connector, timeout=self.timeout)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def step(self) -> int:
        """Claim one batch of due rows, send what pacing allows, defer the rest. Returns rows claimed."""
        now = self.clock.now()
        rows = await outbox.claim_due(self.pool, now=now, limit=self.settings.send_batch)
        if not rows:
            return 0
        rows = sorted(rows, key=lambda r: (r["due"], r["id"]))
        go: list[Any] = []
        defer_ids: list[int] = []
        defer_at: list[float] = []
        for r in rows:
            wait = self.pacer.try_acquire(r["phone_number_id"], r["recipient"], now)
            if wait > 0:
                defer_ids.append(r["id"])
                defer_at.append(now + wait)
            else:
                go.append(r)
        if defer_ids:
            await outbox.defer(self.pool, ids=defer_ids, until=defer_at)
        if go:
            results = await asyncio.gather(*(self._send(r) for r in go))
            await self._record(go, results)
        return len(rows)

    async def _send(self, row: Any) -> tuple[Classified, float]:
        async with self._limit:
            sent_at = self.clock.now()
            return await providers.send(self.session, self.settings, row), sent_at

    async def _record(self, rows: list[Any], results: list[tuple[Classified, float]]) -> None:
        now = self.clock.now()
        s = self.settings
        out: list[outbox.Result] = []
        for r, (raw_c, sent_at) in zip(rows, results, strict=True):
            attempt = r["attempts"] + 1
            c = finalize(raw_c, attempt, s.send_max_attempts)
            next_at: float | None = None
            if c.outcome is Outcome.RETRY:
                delay = retry_delay_s(
                    c, attempt, s.retry_base_ms / 1000, s.retry_max_ms / 1000, s.pair_interval_s, self.rand()
                )
                next_at = now + delay
            out.append(outbox.Result(r["id"], c.state, c.wamid, next_at, c.error, c.code, sent_at))
            metrics.SENDS.labels(r["provider"], c.state.value, str(c.code or "")).inc()
            if c.outcome is not Outcome.ACCEPTED:
                log.info("send %s attempt %d: %s (%s)", r["callback_data"][:80], attempt, c.state, c.error)
        await outbox.record_results(self.pool, out, now=now)

    async def run(self, stop: asyncio.Event) -> None:
        """Send until ``stop`` is set, in ``send_loops`` claim loops."""
        await asyncio.gather(*(self._send_loop(stop) for _ in range(self.settings.send_loops)))

    async def _send_loop(self, stop: asyncio.Event) -> None:
        poll_s = self.settings.send_poll_ms / 1000
        while not stop.is_set():
            try:
                claimed = await self.step()
            except Exception:
                log.exception("sender step failed")
                claimed = 0
            if claimed < self.settings.send_batch:
                await sleep_unless_stopped(stop, poll_s)
