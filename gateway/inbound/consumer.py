"""Consumers: claim staged webhook rows and act on each event exactly once.

Fast path, a constant number of statements per batch whatever its size: one claim
(``FOR UPDATE SKIP LOCKED``) and one statement that inserts every key into
``processed_webhook_events`` and applies side effects only for the keys it newly inserted,
then the handlers of the fresh events (if any are configured), then COMMIT.

Everything after the claim runs under a savepoint, so when it fails the failure is recorded
in the transaction that still holds the rows' locks (no other consumer can grab them in
between). What is recorded depends on where the failure came from (``gateway.core.faults``):

- parsing and planning never fail a batch: a body that is no payload is parked at once, a
  fragment or event that cannot be planned is a dead item at once, with its bytes;
- anything raised while applying one event is that event's: the batch is redone event by
  event, each in its own savepoint. The good events commit and their rows are marked done;
  an event that fails becomes a ``dead_events`` item (its raw fragment, its key, the error),
  retried on its own with backoff and parked dead after ``max_attempts``;
- only an error the database reports as systemic pauses the pipeline, and only when a probe
  (harmless events of the same kinds, applied and rolled back) fails too: the rows are put
  off with capped backoff, no attempt counted, and stay visible as lag. A day that has no
  partition yet is created on the spot.

A row that heads claim after claim that commit nothing (its batch kills the connection, or
fails where nothing can be recorded) is taken alone after ``faults.STALL_CLAIMS`` such
claims; failing alone, it is counted an attempt in a transaction of its own, and parked dead
after ``max_attempts`` while the rows behind it flow.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import time
from collections.abc import Callable, Sequence
from datetime import datetime

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from gateway import metrics, tracing
from gateway.core.aio import back_off
from gateway.core.backoff import backoff_delay
from gateway.core.events import Event, Item, Status
from gateway.core.faults import (
    Fault,
    HandlerError,
    Health,
    Verdict,
    classify,
    fault_delay,
    missing_partition,
    verdict,
)
from gateway.core.heartbeat import HEARTBEATS
from gateway.core.jsonspan import pointer
from gateway.core.limits import LogThrottle
from gateway.core.planning import Plan, StagedRow, describe, plan_batch, plan_event
from gateway.core.settings import Settings
from gateway.core.spacing import Spacing
from gateway.handlers import Registry, set_reply_per_bot
from gateway.handlers import load as load_handlers
from gateway.inbound import triage
from gateway.inbound.dead_items import Failure, bad_item, error_text, failed_item, raw_fragment, rebuild
from gateway.store import dead_events, inbox

log = logging.getLogger(__name__)
# The fast path's savepoint (one per transaction: a batch is one transaction).
_SAVEPOINT = "gateway_consumer_batch"
# The batch statement is planned once per connection, not per batch: a custom plan of its
# fifteen CTEs over partitioned tables costs about 2 ms, more than executing a small batch.
# Its parameters are arrays and JSON whose contents a custom plan does not look at either,
# and no partition key is among them. Local to the fast path: ROLLBACK TO SAVEPOINT undoes it
# for the event-by-event path, and handlers' own statements get the session's setting back.
_FAST_PATH = f"SAVEPOINT {_SAVEPOINT}; SET LOCAL plan_cache_mode = force_generic_plan"
_HANDLERS_PLANS = "SET LOCAL plan_cache_mode TO DEFAULT"
# A database outage fails every batch alike: at most one line per kind per 10 s.
_WARN = LogThrottle(10.0)


def _warn(kind: str, msg: str, *args: object) -> None:
    held = _WARN.allow(kind, time.monotonic())
    if held is not None:
        log.warning(msg + "%s", *args, _WARN.suffix(held))


# A connection the consumer holds a transaction on.
Conn = asyncpg.Connection | PoolConnectionProxy

# One per process: what its consumers have seen lately (see ``Health``).
HEALTH = Health(time.monotonic)
# Dead items are looked at when no staged row is due, and at least this often.
ITEMS_EVERY_S = 1.0
# Rows put off while the day they need gets its partition.
PARTITION_RETRY_S = 0.05


class DueFrom:
    """A lower bound of every pending row's next_attempt_at, shared by a process's consumers
    (``inbox.due_from``, read every ``DUE_FROM_S`` by their group): their claims start there,
    past the dead index entries of rows done since the last vacuum. None: from the start."""

    def __init__(self) -> None:
        self.at: datetime | None = None


class Consumer:
    """One claim-process-commit loop over ``webhook_inbox`` and its dead items."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        settings: Settings,
        *,
        rand: Callable[[], float] = random.random,
        health: Health | None = None,
        handlers: Registry | None = None,
        due: DueFrom | None = None,
        spacing: Spacing | None = None,
    ) -> None:
        self._pool = pool
        self._due = due
        # Shared by a process's consumers (their group passes one): woken batches start apart.
        self._spacing = spacing if spacing is not None else Spacing(settings.consumer_batch_gap_ms / 1000)
        self._s = settings
        self._rand = rand
        self._health = HEALTH if health is None else health
        if handlers is None and settings.handlers:
            handlers = load_handlers(settings.handlers)
        set_reply_per_bot(settings.reply_per_bot_tenants)
        self._handlers = handlers if handlers else None
        self._items_at = -ITEMS_EVERY_S
        # The rows of the claim being handled, head first (until its transaction commits).
        self._claimed: list[int] = []
        self.wake = asyncio.Event()
        # The last step may have left work due right now: staged rows (its batch was full, or the
        # byte budget cut it short), or dead items (it claimed some). Otherwise the loop waits for
        # a wake-up: a NOTIFY that came during the step sets it, and claiming again at once would
        # find nothing.
        self._more = False
        self._again = False
        # True while the loop waits for a wake-up (a group wakes one idle consumer per NOTIFY).
        self.idle = False
        # True from a wake-up to the start of the batch it calls for (its group sets it when it
        # wakes this one; the loop while it waits for its turn, Spacing): that batch will claim
        # what a NOTIFY announces meanwhile, so the group wakes no other consumer for it.
        self.starting = False
        # Called when a batch left more due (a group wakes an idle sibling: a backlog is
        # drained in parallel).
        self.on_more: Callable[[], None] | None = None
        # Called after a batch that may have inserted deliveries has committed: a forwarder in
        # the same process starts its round at once instead of waiting for the NOTIFY to come
        # round through PostgreSQL and its LISTEN connection (which still wakes the others).
        self.on_deliveries: Callable[[], None] | None = None

    # -- the loop -------------------------------------------------------------------------

    async def step(self) -> int:
        """One batch of staged rows, then due dead items when idle or once a second; work done."""
        self._more = False
        n = await self.process_batch()
        items = 0
        now = time.monotonic()
        if n == 0 or now - self._items_at >= ITEMS_EVERY_S:
            self._items_at = now
            items = await self.process_items()
            n += items
        self._again = self._more or items > 0
        return n

    async def run(self, stop: asyncio.Event) -> None:
        s = self._s
        poll_s = s.consumer_poll_ms / 1000
        # A turn is one batch (bounded by the driver's command timeout), then at most a fault
        # backoff or a poll interval: silent longer than that and GATEWAY_LIVENESS_S, it is stuck.
        beat = HEARTBEATS.loop("consumer", s.liveness_s + s.fault_backoff_max_ms / 1000 + poll_s)
        clock = asyncio.get_running_loop().time
        reserved = False  # this step's start was reserved after a wake-up
        try:
            while not stop.is_set():
                beat()
                self.wake.clear()
                if not reserved:
                    self._spacing.started(clock())
                reserved = False
                self.starting = False
                try:
                    await self.step()
                except Exception as exc:
                    # Nothing could be recorded (the connection or the transaction is gone):
                    # the rows are unlocked and due, so this consumer itself waits before
                    # trying again, with the same capped backoff, and counts no attempt
                    # anywhere; the row that headed the claim is remembered (a stall is
                    # taken alone).
                    self._uncommitted()
                    delay = self._fault(exc)
                    await back_off(stop, self.wake, delay, min(delay, s.retry_base_ms / 1000))
                    continue
                if self._again:
                    if self._more and self.on_more is not None:  # staged rows: a sibling helps
                        self.on_more()
                    continue
                self.idle = True
                try:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self.wake.wait(), poll_s)
                finally:
                    self.idle = False
                self.starting = True
                reserved = True
                delay = self._spacing.reserve(clock())
                if delay > 0:
                    await asyncio.sleep(delay)  # at most the gap: a stop is seen right after
        finally:
            beat.done()

    # -- staged rows ----------------------------------------------------------------------

    async def process_batch(self) -> int:
        """Claim one batch of due rows and handle it; returns the rows claimed (0: none due)."""
        stalled = self._health.stalled()
        if stalled is not None:
            return await self._alone(stalled)
        started = time.perf_counter()
        async with self._pool.acquire() as conn, conn.transaction():
            rows, more = await inbox.claim_batch(
                conn,
                limit=self._s.consumer_batch,
                max_bytes=self._s.consumer_batch_bytes,
                due_from=None if self._due is None else self._due.at,
            )
            if not rows:
                return 0
            self._more = more
            forwards = await self._handle(conn, rows)
        self._committed(forwards)
        metrics.CONSUMER_BATCH_ROWS.observe(len(rows))
        metrics.CONSUMER_BATCH_SECONDS.observe(time.perf_counter() - started)
        return len(rows)

    async def _handle(self, conn: Conn, rows: list[StagedRow]) -> bool:
        """The claimed rows, in the claim's transaction; whether deliveries may be new."""
        self._claimed = [r.id for r in rows]
        plan = plan_batch(rows)  # never raises
        try:
            # A savepoint of our own, not a nested transaction(): COMMIT releases it, one
            # round trip (RELEASE SAVEPOINT) fewer per batch.
            await conn.execute(_FAST_PATH)
            with tracing.span("consumer.batch", rows=len(rows)):
                result = await self._fast(conn, plan)
        except Exception as exc:
            if conn.is_closed():
                raise
            await conn.execute(f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}")
            await self._slow(conn, plan, exc)
            return bool(plan.forwards)
        triage.observe(plan, result)
        return result.deliveries > 0

    def _committed(self, forwards: bool) -> None:
        self._health.succeeded(self._claimed)
        self._claimed = []
        if forwards and self.on_deliveries is not None:
            self.on_deliveries()

    def _uncommitted(self) -> None:
        if self._claimed:
            self._health.uncommitted(self._claimed[0])
        self._claimed = []

    async def _alone(self, inbox_id: int) -> int:
        """A row that headed claims that committed nothing, taken alone. Failing again where
        nothing can be recorded, it is counted an attempt in a transaction of its own (that
        the database takes it shows the database works): dead after ``max_attempts``."""
        try:
            async with self._pool.acquire() as conn, conn.transaction():
                row = await inbox.claim_due_row(conn, inbox_id=inbox_id)
                if row is None:  # done, dead, put off or held by another consumer: not ours now
                    self._health.succeeded([inbox_id])
                    return 0
                forwards = await self._handle(conn, [row])
        except Exception as exc:
            if not self._claimed:
                raise
            self._claimed = []
            s = self._s
            delay = backoff_delay(1, s.retry_base_ms / 1000, s.retry_max_ms / 1000, self._rand)
            await triage.stall_attempt(
                self._pool, inbox_id=inbox_id, exc=exc, max_attempts=s.max_attempts, delay_s=delay
            )
            self._health.succeeded([inbox_id])
            return 1
        self._committed(forwards)
        return 1

    async def _fast(self, conn: Conn, plan: Plan) -> inbox.Applied:
        result = await inbox.apply_plan(conn, plan)
        if plan.bad:
            await dead_events.record(conn, [bad_item(row, item) for row, item in plan.bad])
        await self._fragments(conn, [(ev, row, item) for ev, row, item in plan.events if item.scrubbed])
        if self._handlers and result.fresh_keys:
            await conn.execute(_HANDLERS_PLANS)
            fresh = set(result.fresh_keys)
            for ev, _row, _item in plan.events:
                if ev.key in fresh:
                    await self._run_handlers(conn, ev, result.callers)
        return result

    async def _slow(self, conn: Conn, plan: Plan, exc: BaseException) -> None:
        """The fast path failed (rolled back to its savepoint): defer, or go event by event."""
        ids = [r.id for r, _ in plan.parsed] + plan.parked
        if classify(exc) is Fault.SYSTEM:
            source = plan.events[0][1].source if plan.events else "meta"
            kinds = {ev.kind for ev, _, _ in plan.events}
            confirmed = await triage.probe(self._pool, conn, exc, kinds, source)
            if confirmed is not None:
                await self._defer(conn, ids, confirmed)
                return
        metrics.CONSUMER_FALLBACKS.inc()
        _warn("fallback", "batch of %d rows failed (%s); retrying event by event", len(ids), describe(exc))
        try:
            async with conn.transaction():
                await self._per_event(conn, plan)
        except Exception as inner:
            if conn.is_closed():
                raise
            await self._defer(conn, ids, triage.cause(inner))

    async def _per_event(self, conn: Conn, plan: Plan) -> None:
        """Each event in its own savepoint; an event's failure is its own unless the database
        reports a systemic error that a probe confirms (then SystemFault: defer them all)."""
        failures: list[Failure] = []
        seen: set[str] = set()
        for row, items in plan.parsed:
            for item in items:
                for ev in item.events:
                    if ev.key in seen:
                        continue
                    seen.add(ev.key)
                    try:
                        async with conn.transaction():
                            result = await inbox.apply_plan(
                                conn,
                                plan_event(ev, row.id, row.source),
                            )
                            if item.scrubbed:
                                await self._fragments(conn, [(ev, row, item)])
                            if self._handlers and result.fresh_keys:
                                await self._run_handlers(conn, ev, result.callers)
                    except Exception as exc:
                        failures.append(Failure(row, item, ev, exc, await self._triage(conn, exc, ev.kind)))
                    else:
                        metrics.CONSUMER_EVENTS.labels(
                            ev.kind, "processed" if result.fresh else "duplicate"
                        ).inc()
        new = [bad_item(row, item) for row, item in plan.bad]
        for f in failures:
            v = verdict(f.fault, probe_failed=False)
            new.append(failed_item(f, v, max_attempts=self._s.max_attempts, delay=self._item_delay))
        rows = Plan(done=plan.done, parked=plan.parked, parked_why=plan.parked_why)
        try:
            async with conn.transaction():
                await dead_events.record(conn, new)
        except Exception as exc:
            # The items themselves cannot be stored: their rows are parked whole, bytes intact
            # (a replay finds the events that went through already done).
            await self._triage(conn, exc, "message")
            bad = {i.inbox_id for i in new}
            why = f"its failed events could not be recorded: {describe(exc)}"
            rows = Plan(
                done=[d for d in plan.done if d not in bad],
                parked=[*plan.parked, *sorted(bad)],
                parked_why=[*plan.parked_why, *(why for _ in bad)],
            )
            new = []
            metrics.DEAD_LETTERS.labels("unparseable").inc(len(bad))
        await inbox.apply_plan(conn, rows)
        for i in new:
            self._count_item(i.state, i.deferrals > 0, i.kind)

    async def _triage(self, conn: Conn, exc: BaseException, kind: str) -> Fault:
        """What failed one event in its own savepoint. A lost connection aborts the pass (re-
        raised); a systemic error that a probe confirms raises SystemFault."""
        if conn.is_closed():
            raise exc
        fault = classify(exc)
        if fault is Fault.SYSTEM:
            confirmed = await triage.probe(self._pool, conn, exc, [kind])
            if confirmed is not None:
                raise triage.SystemFault(confirmed) from exc
            return Fault.EVENT
        return fault

    async def _defer(self, conn: Conn, ids: Sequence[int], exc: BaseException) -> None:
        """The system failed: rows due again after the fault backoff, no attempt counted."""
        delay = PARTITION_RETRY_S if missing_partition(exc) else self._fault(exc)
        await inbox.defer(conn, ids=ids, delay_s=delay, error=describe(exc))

    def _fault(self, exc: BaseException) -> float:
        """Count a system fault; the capped backoff to wait; log at most every few seconds."""
        streak = self._health.system_fault()
        metrics.CONSUMER_FAULTS.inc()
        s = self._s
        delay = fault_delay(streak, s.retry_base_ms / 1000, s.fault_backoff_max_ms / 1000, self._rand)
        _warn(
            "fault",
            "database failing (%s); retrying in %.1fs, no attempt counted (%d in a row)",
            describe(exc),
            delay,
            streak,
        )
        return delay

    # -- dead items -----------------------------------------------------------------------

    async def process_items(self) -> int:
        """Retry due dead items, each in its own savepoint; returns the items claimed."""
        async with self._pool.acquire() as conn, conn.transaction():
            claimed = await dead_events.claim(conn, limit=self._s.consumer_batch)
            if not claimed:
                return 0
            try:
                async with conn.transaction():
                    await self._retry_items(conn, claimed)
            except Exception as exc:
                if conn.is_closed():
                    raise
                cause = triage.cause(exc)
                delay = self._fault(cause)
                for it in claimed:
                    await dead_events.failed(
                        conn,
                        item_id=it.id,
                        state=dead_events.RETRY,
                        attempts=0,
                        deferrals=1,
                        delay_s=delay,
                        error=describe(cause),
                    )
                return len(claimed)
        self._health.succeeded()
        return len(claimed)

    async def _retry_items(self, conn: Conn, claimed: list[dead_events.Claimed]) -> None:
        done: list[int] = []
        failures: list[tuple[dead_events.Claimed, BaseException, Fault]] = []
        for it in claimed:
            try:
                async with conn.transaction():
                    for ev in rebuild(it):
                        result = await inbox.apply_plan(
                            conn,
                            plan_event(ev, it.inbox_id, it.source),
                        )
                        if result.fresh_keys and b"\\u" in it.fragment:
                            await dead_events.record_fragments(
                                conn,
                                keys=[ev.key],
                                inbox_ids=[it.inbox_id],
                                paths=[it.path],
                                fragments=[it.fragment],
                            )
                        if self._handlers and result.fresh_keys:
                            await self._run_handlers(conn, ev, result.callers)
            except Exception as exc:
                failures.append((it, exc, await self._triage(conn, exc, it.kind)))
            else:
                done.append(it.id)
        await dead_events.done(conn, ids=done)
        s = self._s
        for it, error, fault in failures:
            v = verdict(fault, probe_failed=False)
            attempts = it.attempts + (v is Verdict.ATTEMPT)
            dead = v is Verdict.DEAD or (v is Verdict.ATTEMPT and attempts >= s.max_attempts)
            delay = self._item_delay(v, attempts, it.deferrals + 1)
            await dead_events.failed(
                conn,
                item_id=it.id,
                state=dead_events.DEAD if dead else dead_events.RETRY,
                attempts=int(v is not Verdict.DEFER),
                deferrals=int(v is Verdict.DEFER),
                delay_s=delay,
                error=error_text(error),
            )
            self._count_item(dead_events.DEAD if dead else dead_events.RETRY, v is Verdict.DEFER, it.kind)
            if dead:
                log.error(
                    "dead item %d (%s) parked after %d attempts: %s", it.id, it.event_key, attempts, error
                )

    # -- helpers --------------------------------------------------------------------------

    async def _run_handlers(self, conn: Conn, ev: Event, callers: dict[str, str]) -> None:
        """Run the handlers of ``ev``; a status gets the caller's biz_opaque_callback_data."""
        assert self._handlers is not None
        if isinstance(ev, Status) and ev.key in callers:
            ev = dataclasses.replace(ev, biz_opaque_callback_data=callers[ev.key])
        timeout = self._s.handler_timeout_ms / 1000
        for h in self._handlers.for_event(ev):
            try:
                await asyncio.wait_for(h.fn(ev, conn), timeout)
            except Exception as exc:
                raise HandlerError(h.name, exc) from exc
            metrics.HANDLER_CALLS.labels("ok").inc()

    async def _fragments(self, conn: Conn, events: list[tuple[Event, StagedRow, Item]]) -> None:
        """Exact bytes of events stored escaped (a NUL, a lone surrogate), beside their key."""
        if not events:
            return
        await dead_events.record_fragments(
            conn,
            keys=[ev.key for ev, _, _ in events],
            inbox_ids=[row.id for _, row, _ in events],
            paths=[pointer(item.path) for _, _, item in events],
            fragments=[raw_fragment(row, item) for _, row, item in events],
        )

    def _item_delay(self, v: Verdict, attempts: int, deferrals: int) -> float:
        s = self._s
        if v is Verdict.DEFER:
            return fault_delay(deferrals, s.retry_base_ms / 1000, s.fault_backoff_max_ms / 1000, self._rand)
        return backoff_delay(max(attempts, 1), s.retry_base_ms / 1000, s.retry_max_ms / 1000, self._rand)

    def _count_item(self, state: str, deferred: bool, kind: str) -> None:
        if state == dead_events.DEAD:
            metrics.DEAD_LETTERS.labels("bad_fragment" if kind == "bad" else "max_attempts").inc()
        elif not deferred:
            metrics.CONSUMER_FAILURES.inc()
