"""The sender worker: claims due outbox rows, paces them, sends them and records the outcome.

Rows are claimed in one statement (``pending`` → ``sending``, SKIP LOCKED), so any number of
senders share the table and each row is sent by one of them. What an outcome means is decided
by ``gateway.classify``; pacing by ``gateway.pacing``; both pure. Time comes from an injectable
clock so tests can run minutes of pacing and backoff without sleeping.

The housekeeping step runs the reconciler (stale ``sending`` → ``unknown``; ``unknown`` past
the window → ``pending`` once or ``review``), purges expired idempotency keys in bounded
batches and refreshes the outbox gauges.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import random
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

import aiohttp
import asyncpg
import orjson
from aiohttp import web

from gateway import metrics
from gateway.appkeys import POOL, SETTINGS
from gateway.classify import (
    Classified,
    Outcome,
    Transport,
    classify_response,
    classify_transport,
    finalize,
    retry_delay_s,
)
from gateway.cli import command, run_worker
from gateway.pacing import Pacer
from gateway.settings import Settings
from gateway.sqlfiles import q

log = logging.getLogger(__name__)

HOUSEKEEPING_S = 5.0
HOUSEKEEPING_BATCH = 1000
MAX_PURGE_ROUNDS = 20


class Clock(Protocol):
    def now(self) -> float: ...


class SystemClock:
    def now(self) -> float:
        return time.time()


def _request(settings: Settings, row: Any) -> tuple[str, dict[str, str], bytes]:
    """URL, headers and body of one send, for the row's provider."""
    payload = row["payload"]
    if row["provider"] == "tenashi":
        body = {"to": row["recipient"], "phone_number_id": row["phone_number_id"], "message": payload}
        headers = {
            "Authorization": f"Bearer {settings.tenashi_token}",
            # The key makes a retry of an ambiguous send safe: Tenashi replays, it does not resend.
            "Idempotency-Key": row["callback_data"],
            "Content-Type": "application/json",
        }
        return f"{settings.tenashi_url}/api/v1/messages", headers, orjson.dumps(body)
    body = {
        "messaging_product": "whatsapp",
        "recipient_type": "individual",
        "to": row["recipient"],
        **payload,
        "biz_opaque_callback_data": row["callback_data"],
    }
    headers = {"Authorization": f"Bearer {settings.graph_token}", "Content-Type": "application/json"}
    return f"{settings.graph_url}/{row['phone_number_id']}/messages", headers, orjson.dumps(body)


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
        connect_s = settings.send_connect_timeout_ms / 1000
        read_s = settings.send_read_timeout_ms / 1000
        # sock_connect bounds "never reached"; sock_read bounds the wait for an answer; total is a
        # backstop against a trickling answer, and sets the lease after which 'sending' is stale.
        self.timeout = aiohttp.ClientTimeout(
            total=connect_s + 2 * read_s, sock_connect=connect_s, sock_read=read_s
        )
        self.lease_s = connect_s + 2 * read_s + 60.0
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

    # --- sending ------------------------------------------------------------------------------

    async def step(self) -> int:
        """Claim one batch of due rows, send what pacing allows, defer the rest. Returns rows claimed."""
        now = self.clock.now()
        rows = await self.pool.fetch(q("outbox_claim_due"), now, self.settings.send_batch)
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
            await self.pool.execute(q("outbox_defer"), defer_ids, defer_at)
        if go:
            results = await asyncio.gather(*(self._send(r) for r in go))
            await self._record(go, results)
        return len(rows)

    async def _send(self, row: Any) -> tuple[Classified, float]:
        url, headers, body = _request(self.settings, row)
        async with self._limit:
            sent_at = self.clock.now()
            try:
                async with self.session.post(url, data=body, headers=headers) as resp:
                    raw = await resp.read()
                    status = resp.status
            except (aiohttp.ConnectionTimeoutError, aiohttp.ClientConnectorError):
                return classify_transport(Transport.CONNECT_FAILED, row["provider"]), sent_at
            except (aiohttp.ServerTimeoutError, TimeoutError):
                return classify_transport(Transport.READ_TIMEOUT, row["provider"]), sent_at
            except aiohttp.ClientError:
                # The request may have been written: disconnects, resets, truncated answers.
                return classify_transport(Transport.CONNECTION_LOST, row["provider"]), sent_at
        try:
            parsed = orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            parsed = None
        return classify_response(row["provider"], status, parsed), sent_at

    async def _record(self, rows: list[Any], results: list[tuple[Classified, float]]) -> None:
        now = self.clock.now()
        s = self.settings
        ids: list[int] = []
        states: list[str] = []
        wamids: list[str | None] = []
        next_at: list[float | None] = []
        errors: list[str | None] = []
        codes: list[int | None] = []
        sent: list[float] = []
        for r, (raw_c, sent_at) in zip(rows, results, strict=True):
            attempt = r["attempts"] + 1
            c = finalize(raw_c, attempt, s.send_max_attempts)
            ids.append(r["id"])
            states.append(c.state)
            wamids.append(c.wamid)
            errors.append(c.error)
            codes.append(c.code)
            sent.append(sent_at)
            if c.outcome is Outcome.RETRY:
                delay = retry_delay_s(
                    c, attempt, s.retry_base_ms / 1000, s.retry_max_ms / 1000, s.pair_interval_s, self.rand()
                )
                next_at.append(now + delay)
            else:
                next_at.append(None)
            metrics.SENDS.labels(r["provider"], c.state, str(c.code or "")).inc()
            if c.outcome is not Outcome.ACCEPTED:
                log.info("send %s attempt %d: %s (%s)", r["callback_data"][:80], attempt, c.state, c.error)
        await self.pool.execute(
            q("outbox_record_results"), ids, states, wamids, next_at, errors, codes, sent, now
        )

    # --- housekeeping ----------------------------------------------------------------------------

    async def housekeeping(self) -> dict[str, int]:
        """Reconcile, purge expired keys, refresh gauges. Returns counts, for tests and logs."""
        now = self.clock.now()
        expired = await self.pool.fetch(q("outbox_expire_sending"), now, self.lease_s, HOUSEKEEPING_BATCH)
        reconciled = await self.pool.fetch(
            q("outbox_reconcile_unknown"), now, float(self.settings.reconcile_window_s), HOUSEKEEPING_BATCH
        )
        for r in reconciled:
            log.info("reconciled %s/%s: unknown -> %s", r["tenant"], r["idem_key"][:80], r["state"])
        purged = 0
        for _ in range(MAX_PURGE_ROUNDS):
            status = await self.pool.execute(q("idem_purge_expired"), self.settings.purge_batch)
            n = int(status.split()[-1])
            purged += n
            if n < self.settings.purge_batch:
                break
        await self.refresh_gauges(now)
        return {"expired_sending": len(expired), "reconciled": len(reconciled), "purged_keys": purged}

    async def refresh_gauges(self, now: float) -> None:
        counts = {r["state"]: r["n"] for r in await self.pool.fetch(q("outbox_count_by_state"))}
        for state in ("pending", "sending", "accepted", "unknown", "failed", "review", "cancelled"):
            metrics.OUTBOX_ROWS.labels(state).set(counts.get(state, 0))
        oldest = await self.pool.fetchval(q("outbox_oldest_unknown"))
        metrics.OLDEST_UNKNOWN.set(max(0.0, now - oldest) if oldest is not None else 0.0)

    # --- loops --------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Send until ``stop`` is set: ``send_loops`` claim loops plus housekeeping."""
        loops = [self._send_loop(stop) for _ in range(self.settings.send_loops)]
        await asyncio.gather(*loops, self._housekeeping_loop(stop))

    async def _send_loop(self, stop: asyncio.Event) -> None:
        poll_s = self.settings.send_poll_ms / 1000
        while not stop.is_set():
            try:
                claimed = await self.step()
            except Exception:
                log.exception("sender step failed")
                claimed = 0
            if claimed < self.settings.send_batch:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), poll_s)

    async def _housekeeping_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.housekeeping()
            except Exception:
                log.exception("sender housekeeping failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), HOUSEKEEPING_S)


async def sender_ctx(app: web.Application) -> AsyncIterator[None]:
    """cleanup_ctx for ``gateway serve``: the sender runs beside the HTTP server."""
    sender = Sender(app[POOL], app[SETTINGS])
    stop = asyncio.Event()
    task = asyncio.create_task(sender.run(stop))
    yield
    stop.set()
    try:
        await asyncio.wait_for(task, sender.timeout.total or 30)
    except TimeoutError:
        log.warning("sender did not stop in time; rows it was sending become unknown after the lease")
    await sender.close()


@command("send", "run the sender (outbox → provider) and reconciler alone")
def cmd_send(settings: Settings, ns: argparse.Namespace) -> int:
    async def work(pool: asyncpg.Pool, stop: asyncio.Event) -> None:
        sender = Sender(pool, settings)
        log.info("sender running: %s", settings.redacted())
        try:
            await sender.run(stop)
        finally:
            await sender.close()

    return run_worker(settings, (settings.db_pool_min, settings.db_pool_max), work)
