"""The sender: claims due outbox rows, paces them, sends them and records the outcome.

A claim is one transaction: lock due pending rows (SKIP LOCKED, so senders share the table and
each row is sent by one of them), each with the earlier row of its customer it must wait for
(looked up by state, so a row another sender holds counts too), lock their numbers and breakers
(advisory try-locks: a key another sender holds is skipped, never waited for; a number's lock
covers its pairs), let ``gateway.core.pacing`` decide which go and which wait, store the new
pace and mark the chosen rows ``sending``. So pacing, per-customer order and breakers hold
across every sender process; one process claims one batch at a time. What an outcome means is
``gateway.core.classify``'s call; an account-level error opens a breaker and its row waits as
``pending``. Senders wake on NOTIFY ``outbox`` (the send API's enqueue), when a row they put
off is due (or directly, from the send front ends of their own process:
gateway.outbound.wake), and poll as a fallback. Time comes from an injectable clock
so tests can run minutes of pacing and backoff without sleeping. Reconciling sends whose fate
is unknown is ``gateway.maintenance.reconciler``'s job.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import aiohttp
import asyncpg

from gateway import metrics, tracing
from gateway.core import tenancy
from gateway.core.aio import first_set
from gateway.core.classify import Classified, SendOutcome, finalize, retry_delay_s
from gateway.core.clock import Clock, SystemClock
from gateway.core.enums import OutboxState
from gateway.core.errors import describe
from gateway.core.heartbeat import HEARTBEATS
from gateway.core.limits import LogThrottle
from gateway.core.pacing import (
    Ahead,
    Breaker,
    BreakerId,
    Candidate,
    limits_for,
    plan_claim,
    settle_probe,
    trip,
)
from gateway.core.settings import Settings
from gateway.outbound import providers
from gateway.store import outbox, pacing
from gateway.store.db import citus_state
from gateway.store.listen import listen, own_connection

log = logging.getLogger(__name__)
# An outage fails every step alike: one line per 10 s, with the count held back.
_WARN = LogThrottle(10.0)

CHANNEL = "outbox"
# Rows looked at per claim, per row that may go: room for rows pacing holds back.
SCAN_FACTOR = 2
# A row behind an earlier one of its pair that is still in flight looks again this much later
# (a provider answers well within it; one message per pair is in flight at a time).
RECHECK_S = 0.2
# Times rows this process put off are due again, kept to wake a loop then (not a poll later).
MAX_TIMERS = 4096
# A claim that found rows whose number another sender's claim held looks again this soon.
CONTENDED_RETRY_S = 0.02


@dataclass(frozen=True, slots=True)
class Claimed:
    """What a claim did: the rows it sends, how many it put off, whether it found rows whose
    keys another sender held (and so left them)."""

    rows: list[Any]
    deferred: int
    contended: bool

    @property
    def dealt(self) -> int:
        return len(self.rows) + self.deferred


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
        # The database is a Citus coordinator: this sender announces the outcomes it records
        # (asked once, by the first record).
        self._citus: bool | None = None
        self.limits = limits_for(settings)
        # Rows this process sent as a breaker's probe: row id -> the breakers waiting on it.
        self._probes: dict[int, list[BreakerId]] = {}
        self._wakes: list[asyncio.Event] = []
        self._timers: list[float] = []  # heap of the times rows this process put off are due
        # Rows this process sends with rows of the same customer put off behind them:
        # row id -> (those rows, the earliest their pair allows the next).
        self._behind: dict[int, tuple[list[int], float]] = {}
        self._claiming = asyncio.Lock()
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
        return (await self._step()).dealt

    async def _step(self) -> Claimed:
        # One claim at a time per process: the loops of one sender never race each other for a
        # number's lock (a loop that lost it would drop rows a NOTIFY woke it for); their
        # provider requests still overlap.
        async with self._claiming:
            claimed = await self._claim(self.clock.now())
        rows = claimed.rows
        if rows:
            try:
                with tracing.span("sender.batch", rows=len(rows)):
                    results = await asyncio.gather(*(self._send(r) for r in rows))
                    await self._record(rows, results)
            finally:
                for r in rows:  # recorded or not, these sends are over for this process
                    self._behind.pop(r["id"], None)
        return claimed

    async def _claim(self, now: float) -> Claimed:
        s = self.settings
        async with self.pool.acquire() as conn, conn.transaction():
            found = await outbox.claim_candidates(conn, now=now, limit=s.send_batch * SCAN_FACTOR)
            if not found:
                return Claimed([], 0, False)
            cands = [
                Candidate(
                    r["id"],
                    r["provider"],
                    r["phone_number_id"],
                    r["recipient"],
                    r["tenant"],
                    r["person"],
                    tenancy.token_key(s, r["provider"], r["phone_number_id"]),
                    None if r["ahead_id"] is None else Ahead(r["ahead_id"], r["ahead_state"], r["ahead_due"]),
                )
                for r in found
            ]
            ids = {b for c in cands for b in c.breakers}
            # One advisory lock per number (it covers every pair of that number) and per
            # breaker: a few per claim, whatever the batch, so the lock table never fills.
            number_keys = {c.keys[0] for c in cands}
            locked = await pacing.try_lock(conn, [*number_keys, *(b.lock_key for b in ids)])
            locked |= {c.keys[1] for c in cands if c.keys[0] in locked}
            contended = any(
                c.keys[0] not in locked or any(b.lock_key not in locked for b in c.breakers) for c in cands
            )
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
                recheck_s=RECHECK_S,
            )
            await pacing.put(conn, plan.pacing)
            await pacing.put_breakers(conn, plan.breakers)
            await outbox.defer(conn, ids=list(plan.defer), until=list(plan.defer.values()))
            marked = await outbox.mark_sending(conn, ids=plan.go, now=now)
        self._push_timers(plan.defer.values())
        rows = [r for r in marked if not r["parked"]]
        self._behind.update({r["id"]: plan.behind[r["id"]] for r in rows if r["id"] in plan.behind})
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
        rows = sorted(rows, key=lambda r: (r["due"], r["id"]))
        return Claimed(rows, len(plan.defer) + len(marked) - len(rows), contended)

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
            elif c.outcome is SendOutcome.RETRY:
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
            if c.outcome is not SendOutcome.ACCEPTED:
                log.info("send %s attempt %d: %s (%s)", r["callback_data"][:80], attempt, c.state, c.error)
        await outbox.record_results(self.pool, out, now=now, key_window_s=s.tenashi_key_window_s)
        if self._citus is None:
            self._citus = (await citus_state(self.pool))[0]
        if self._citus:  # no trigger announces the outcomes there (sql/citus/layout.sql)
            await outbox.announce_outcomes(self.pool, [r.id for r in out])
        await self._wake_behind(out, now)

    async def _wake_behind(self, results: list[outbox.Result], now: float) -> None:
        """A customer's next row, put off until a recheck while this send was in flight, may go
        as soon as the pair allows now that the send is done (not a recheck later). A row that
        goes back to pending still holds it (the claim puts it off again)."""
        woken: list[tuple[int, float]] = []
        for r in results:
            behind = self._behind.pop(r.id, None)
            if behind is not None and r.state != OutboxState.PENDING:
                woken += [(i, max(now, behind[1])) for i in behind[0]]
        if woken:
            await outbox.bring_forward(self.pool, ids=[i for i, _ in woken], to=[at for _, at in woken])
            self._push_timers(at for _, at in woken)
            self.wake()

    def _push_timers(self, times: Iterable[float]) -> None:
        for at in set(times):
            if len(self._timers) < MAX_TIMERS:
                heapq.heappush(self._timers, at)

    def _breaker_key(self, scope: str, row: Any) -> str:
        if scope == "number":
            return str(row["phone_number_id"])
        return tenancy.token_key(self.settings, row["provider"], row["phone_number_id"])

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
                try:
                    claimed = await self._step()
                except Exception as exc:
                    held = _WARN.allow("step", time.monotonic())
                    if held is not None:
                        log.warning("sender step failed: %s%s", describe(exc), _WARN.suffix(held))
                    claimed = Claimed([], 0, False)
                if claimed.dealt < s.send_batch:
                    idle_s = self._idle_s(poll_s)
                    if claimed.contended:
                        # Another sender's claim held rows this one saw: look again once it is done.
                        idle_s = min(idle_s, CONTENDED_RETRY_S)
                    await first_set(stop, wake, within=idle_s)
        finally:
            beat.done()

    def _idle_s(self, poll_s: float) -> float:
        """How long a loop with nothing due waits: until the next row this process put off is
        due (so a row waits for its limits, not for a poll on top), at most a poll interval."""
        now = self.clock.now()
        while self._timers and self._timers[0] <= now:
            heapq.heappop(self._timers)
        return min(poll_s, self._timers[0] - now) if self._timers else poll_s

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
