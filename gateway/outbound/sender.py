"""The sender: claims due outbox rows, paces them, sends them and records the outcome.

A claim is one transaction: lock due pending rows (SKIP LOCKED, so senders share the table and
each row is sent by one of them), lock their numbers and breakers (advisory try-locks: a key
another sender holds is skipped, never waited for; a number's lock covers its pairs), let
``gateway.core.pacing`` decide which go and which wait, store the new pace and mark the chosen
rows ``sending``. So pacing and breakers
hold across every sender process. What an outcome means is ``gateway.core.classify``'s call; an
account-level error opens a breaker and its row waits as ``pending``. Senders wake on NOTIFY
``outbox`` (or directly, from the send front ends of their own process: gateway.outbound.wake)
and poll as a fallback. Time comes from an injectable clock
so tests can run minutes of pacing and backoff without sleeping. Reconciling sends whose fate
is unknown is ``gateway.maintenance.reconciler``'s job.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import asyncpg

from gateway import metrics, tracing
from gateway.core.aio import first_set
from gateway.core.classify import Classified, Outcome, finalize, retry_delay_s
from gateway.core.clock import Clock, SystemClock
from gateway.core.enums import OutboxState
from gateway.core.heartbeat import HEARTBEATS
from gateway.core.limits import LogThrottle
from gateway.core.pacing import Breaker, BreakerId, Candidate, limits_for, plan_claim, settle_probe, trip
from gateway.core.planning import describe
from gateway.core.settings import Settings
from gateway.outbound import providers
from gateway.store import outbox, pacing
from gateway.store.listen import listen, own_connection

log = logging.getLogger(__name__)
# An outage fails every step alike: one line per 10 s, with the count held back.
_WARN = LogThrottle(10.0)

CHANNEL = "outbox"
# Rows looked at per claim, per row that may go: room for rows pacing holds back.
SCAN_FACTOR = 2
# A claim that met rows whose number another claim holds looks again this soon: that claim
# holds the lock only for its transaction, and the rows are due (nothing else wakes for them).
HELD_RETRY_S = 0.005


class Sender:
    """Sends the outbox (a service: gateway.runtime.services)."""

    name = "sender"

    def __init__(
        self,
        pool: asyncpg.Pool,
        settings: Settings,
        *,
        clock: Clock | None = None,
        rand: Callable[[], float] = random.random,
        listen: bool = True,
    ) -> None:
        self.pool = pool
        self.listen = listen  # False: poll only (a baseline for benchmarks)
        self.settings = settings
        self.clock = clock or SystemClock()
        self.rand = rand
        self.limits = limits_for(settings)
        # Rows this process sent as a breaker's probe: row id -> the breakers waiting on it.
        self._probes: dict[int, list[BreakerId]] = {}
        self._wakes: list[asyncio.Event] = []
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

    @property
    def stop_grace_s(self) -> float:
        """After a stop, the requests in flight may finish (their own timeout bounds them); a
        row still ``sending`` then becomes unknown when its lease runs out."""
        return self.timeout.total or 30.0

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def step(self) -> int:
        """Claim one batch: send what pacing and breakers allow, put off the rest.

        Returns the rows dealt with (sent or put off); 0 when nothing was due (or free).
        """
        return (await self._step())[0]

    async def _step(self) -> tuple[int, bool]:
        """``step``, and whether it left due rows whose number another claim held."""
        rows, deferred, held = await self._claim(self.clock.now())
        if rows:
            with tracing.span("sender.batch", rows=len(rows)):
                results = await asyncio.gather(*(self._send(r) for r in rows))
                await self._record(rows, results)
        return len(rows) + deferred, held

    async def _claim(self, now: float) -> tuple[list[Any], int, bool]:
        s = self.settings
        async with self.pool.acquire() as conn, conn.transaction():
            found = await outbox.claim_candidates(conn, now=now, limit=s.send_batch * SCAN_FACTOR)
            if not found:
                return [], 0, False
            cands = [
                Candidate(
                    r["id"],
                    r["provider"],
                    r["phone_number_id"],
                    r["recipient"],
                    r["tenant"],
                    r["person"],
                    s.token_key(r["provider"], r["phone_number_id"]),
                )
                for r in found
            ]
            ids = {b for c in cands for b in c.breakers}
            # One advisory lock per number (it covers every pair of that number) and per
            # breaker: a few per claim, whatever the batch, so the lock table never fills.
            number_keys = {c.keys[0] for c in cands}
            locked = await pacing.try_lock(conn, [*number_keys, *(b.lock_key for b in ids)])
            locked |= {c.keys[1] for c in cands if c.keys[0] in locked}
            state = await pacing.get(conn, [k for k in locked if not k.startswith("brk:")])
            breakers = await pacing.get_breakers(conn, [b for b in ids if b.lock_key in locked])
            # Pace from the moment of decision, as close to the send as the claim allows.
            now = max(now, self.clock.now())
            plan = plan_claim(
                cands,
                locked=locked,
                pacing=state,
                breakers=breakers,
                limits=self.limits,
                now=now,
                limit=s.send_batch,
                probe_lease_s=self.lease_s,
            )
            await pacing.put(conn, plan.pacing)
            await pacing.put_breakers(conn, plan.breakers)
            await outbox.defer(conn, ids=list(plan.defer), until=list(plan.defer.values()))
            marked = await outbox.mark_sending(conn, ids=plan.go, now=now)
        held = any(k not in locked for k in number_keys | {b.lock_key for b in ids})
        rows = [r for r in marked if not r["parked"]]
        for r in marked:
            if r["parked"]:
                metrics.SENDS.labels(r["provider"], OutboxState.REVIEW.value, "").inc()
                log.warning(
                    "send %s to review: past its provider's Idempotency-Key window (could send twice)",
                    r["callback_data"][:80],
                )
        for b_id, b in plan.breakers.items():
            if b.probe_id is not None:
                self._probes.setdefault(b.probe_id, []).append(b_id)
                log.info(
                    "breaker %s/%s/%s half-open: probing with one send", b_id.scope, b_id.provider, b_id.key
                )
        # Rows parked for review were dealt with too (put off: not sent).
        dealt = len(plan.defer) + len(marked) - len(rows)
        return sorted(rows, key=lambda r: (r["due"], r["id"])), dealt, held

    async def _send(self, row: Any) -> tuple[Classified, float]:
        async with self._limit:
            sent_at = self.clock.now()
            with tracing.span("provider.send", kind="client", provider=row["provider"]) as span:
                classified = await providers.send(self.session, self.settings, row)
                if span is not None:
                    span.set_attribute("outcome", classified.state.value)
            return classified, sent_at

    async def _record(self, rows: list[Any], results: list[tuple[Classified, float]]) -> None:
        now = self.clock.now()
        s = self.settings
        out: list[outbox.Result] = []
        tripped: dict[BreakerId, Classified] = {}
        probes: dict[BreakerId, tuple[int, bool]] = {}
        for r, (raw_c, _sent_at) in zip(rows, results, strict=True):
            if raw_c.breaker is not None:
                key = self._breaker_key(raw_c.breaker, r)
                tripped[BreakerId(raw_c.breaker, r["provider"], key)] = raw_c
            for b_id in self._probes.pop(r["id"], []):
                probes[b_id] = (r["id"], raw_c.reached)
        opened = await self._update_breakers(tripped, probes, now) if tripped or probes else {}
        for r, (raw_c, sent_at) in zip(rows, results, strict=True):
            attempt = r["attempts"] + 1
            c = finalize(raw_c, attempt, s.send_max_attempts)
            next_at: float | None = None
            if c.breaker is not None:
                key = self._breaker_key(c.breaker, r)
                b = opened.get(BreakerId(c.breaker, r["provider"], key))
                next_at = b.retry_at if b is not None else now + s.breaker_backoff_s
            elif c.outcome is Outcome.RETRY:
                delay = retry_delay_s(
                    c, attempt, s.retry_base_ms / 1000, s.retry_max_ms / 1000, s.pair_interval_s, self.rand()
                )
                next_at = now + delay
            out.append(
                outbox.Result(
                    r["id"],
                    c.state,
                    c.wamid,
                    next_at,
                    c.error,
                    c.code,
                    sent_at,
                    counted=c.breaker is None,
                    maybe_sent=raw_c.maybe_sent,
                    refusal=c.refusal,
                )
            )
            metrics.SENDS.labels(r["provider"], c.state.value, str(c.code or "")).inc()
            if c.outcome is not Outcome.ACCEPTED:
                log.info("send %s attempt %d: %s (%s)", r["callback_data"][:80], attempt, c.state, c.error)
        await outbox.record_results(self.pool, out, now=now, key_window_s=s.tenashi_key_window_s)

    def _breaker_key(self, scope: str, row: Any) -> str:
        if scope == "number":
            return str(row["phone_number_id"])
        return self.settings.token_key(row["provider"], row["phone_number_id"])

    async def _update_breakers(
        self, tripped: dict[BreakerId, Classified], probes: dict[BreakerId, tuple[int, bool]], now: float
    ) -> dict[BreakerId, Breaker]:
        """Open breakers on account-level errors; settle the probes. Returns the open ones."""
        s = self.settings
        ids = sorted(set(tripped) | set(probes))
        changes: dict[BreakerId, Breaker] = {}
        async with self.pool.acquire() as conn, conn.transaction():
            await pacing.lock(conn, [b.lock_key for b in ids])
            current = await pacing.get_breakers(conn, ids)
            for b_id in ids:
                before = current.get(b_id, Breaker("closed"))
                after = before
                if b_id in probes and b_id not in tripped:
                    row_id, reached = probes[b_id]
                    after = settle_probe(
                        before, row_id=row_id, reached=reached, now=now, base_s=s.breaker_backoff_s
                    )
                if b_id in tripped:
                    c = tripped[b_id]
                    after = trip(
                        before,
                        code=c.code,
                        error=c.error,
                        now=now,
                        base_s=s.breaker_backoff_s,
                        cap_s=s.breaker_max_backoff_s,
                    )
                if after != before:
                    changes[b_id] = after
                    self._log_breaker(b_id, before, after)
                if after.state == "closed" and before.state != "closed":
                    await pacing.wake_rows(conn, b_id, now=now)
                current[b_id] = after
            await pacing.put_breakers(conn, changes)
        return {b_id: b for b_id, b in current.items() if b.state == "open"}

    @staticmethod
    def _log_breaker(b_id: BreakerId, before: Breaker, after: Breaker) -> None:
        name = f"{b_id.scope}/{b_id.provider}/{b_id.key}"
        if after.state == "open":
            metrics.BREAKER_TRIPS.labels(b_id.scope, b_id.provider, str(after.code or "")).inc()
            log.warning(
                "breaker %s open after %s (failure %d): its rows wait as pending until a probe at %.0f",
                name,
                after.code,
                after.failures,
                after.retry_at,
            )
        elif after.state == "closed":
            log.warning("breaker %s closed: the probe went through", name)

    async def run(self, stop: asyncio.Event) -> None:
        """Send until ``stop`` is set, in ``send_loops`` claim loops, woken by NOTIFY ``outbox``."""
        self._wakes = [asyncio.Event() for _ in range(self.settings.send_loops)]
        listener = asyncio.create_task(self._listen(stop))
        try:
            await asyncio.gather(*(self._send_loop(stop, w) for w in self._wakes))
        finally:
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listener

    def wake(self, *_: Any) -> None:
        """Rows are due: every idle claim loop claims now (a busy one claims when it is done)."""
        for w in self._wakes:
            w.set()

    async def _send_loop(self, stop: asyncio.Event, wake: asyncio.Event) -> None:
        s = self.settings
        poll_s = s.send_poll_ms / 1000
        # A turn: a claim, the provider requests (bounded by their timeout), a poll interval.
        beat = HEARTBEATS.loop("sender", s.liveness_s + (self.timeout.total or 0) + poll_s)
        try:
            while not stop.is_set():
                beat()
                wake.clear()
                held_back = False
                try:
                    dealt, held_back = await self._step()
                except Exception as exc:
                    held = _WARN.allow("step", time.monotonic())
                    if held is not None:
                        log.warning("sender step failed: %s%s", describe(exc), _WARN.suffix(held))
                    dealt = 0
                if dealt < s.send_batch:
                    # Until a wake or the next poll; rows another claim held back are due now,
                    # and no wake will come for them (theirs woke this loop): soon.
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(min(poll_s, HELD_RETRY_S) if held_back else poll_s):
                            await first_set(stop, wake)
        finally:
            beat.done()

    async def _listen(self, stop: asyncio.Event) -> None:
        """Wake the loops on NOTIFY (polling covers the gaps)."""
        if self.listen:
            liveness_s = self.settings.liveness_s
            await listen(self._listen_connection, CHANNEL, self.wake, stop, liveness_s=liveness_s)

    def _listen_connection(self) -> contextlib.AbstractAsyncContextManager[Any]:
        """A connection of its own when the DSN is known; else one held from the pool (the
        pool resets its LISTENs when it takes it back)."""
        dsn = self.settings.database_url
        if dsn:
            return own_connection(dsn, self.settings.db_connect_timeout_s)
        return self.pool.acquire()
