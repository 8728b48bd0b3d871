"""Consumers: read the lanes of ``webhook_inbox`` by cursor and act on each event exactly once.

A process's consumers own lanes (``gateway.inbound.lanes``) and read them in commit order
(``gateway.core.lanes``). Fast path, a constant number of statements per batch whatever its
size: one read (nothing locked, nothing written) and one statement that inserts every key into
``processed_webhook_events``, applies side effects only for the keys it newly inserted and moves
the lanes' cursors past the batch, then the handlers of the fresh events (if any are
configured), then COMMIT. A cursor moves only while this process owns its lane as it read it,
so a consumer that hung and lost its lanes commits nothing.

Everything after the read runs under a savepoint, so when it fails the failure is recorded in
the same transaction that moves the cursors. What is recorded depends on where the failure came
from (``gateway.core.faults``):

- parsing and planning never fail a batch: a body that is no payload moves aside dead at once
  (``inbox_parked``), a fragment or event that cannot be planned is a dead item at once, with
  its bytes;
- anything raised while applying one event is that event's: the batch is redone event by
  event, each in its own savepoint. The good events commit and the cursors pass the batch; an
  event that fails becomes a ``dead_events`` item (its raw fragment, its key, the error),
  retried on its own with backoff and parked dead after ``max_attempts``;
- only an error the database reports as systemic pauses the pipeline, and only when a probe
  (harmless events of the same kinds, applied and rolled back) fails too: nothing is written,
  the cursors stay, and the consumer backs off (the lag shows it). A day that has no partition
  yet is created on the spot.

A row that heads batch after batch that commit nothing (its batch kills the connection, or
fails where nothing can be recorded) is taken alone after ``faults.STALL_CLAIMS`` such
batches; failing alone, it moves aside (``inbox_parked``, retried on its own with backoff,
dead after ``max_attempts``) and its lane's cursor passes it, while the rows behind it flow.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from gateway import metrics, tracing
from gateway.core.aio import back_off
from gateway.core.backoff import backoff_delay
from gateway.core.errors import describe
from gateway.core.events import Event, Item, Status
from gateway.core.faults import (
    ConsumerHealth,
    Fault,
    HandlerError,
    Verdict,
    classify,
    fault_delay,
    fenced,
    missing_partition,
    verdict,
)
from gateway.core.heartbeat import HEARTBEATS
from gateway.core.jsonspan import pointer
from gateway.core.lanes import Cursor, LaneSet, close_windows
from gateway.core.lanes import advance as advance_cursors
from gateway.core.limits import LogThrottle
from gateway.core.planning import Plan, StagedRow, plan_batch, plan_event
from gateway.core.settings import Settings
from gateway.core.spacing import Spacing
from gateway.handlers import Registry, replying
from gateway.handlers import load as load_handlers
from gateway.inbound import triage
from gateway.inbound.dead_items import Failure, bad_item, error_text, failed_item, raw_fragment, rebuild
from gateway.inbound.lanes import LaneLease
from gateway.store import dead_events, inbox
from gateway.store import lanes as lanes_store

log = logging.getLogger(__name__)
# The fast path's savepoint (one per transaction: a batch is one transaction).
_SAVEPOINT = "gateway_consumer_batch"
# The batch statement is planned once per connection, not per batch: a custom plan of its
# fifteen CTEs over partitioned tables costs about 2 ms, more than executing a small batch.
# Its parameters are arrays and JSON whose contents a custom plan does not look at either,
# and no partition key is among them. Local to the fast path: ROLLBACK TO SAVEPOINT undoes it
# for the event-by-event path, and handlers' own statements get the session's setting back.
_FAST_PATH = f"SAVEPOINT {_SAVEPOINT}; SET LOCAL plan_cache_mode = force_generic_plan"
# A consumer that hangs mid-transaction (SIGSTOP, a stuck event loop) keeps its connection, and
# with it the locks of its batch: the keys it inserted, the outbox rows it locked. Another
# consumer inserting the same key (a redelivery read in another lane) would wait for it for
# ever; the server ends such a transaction once it has been idle this long (its lanes are
# taken over after their lease; a handler may keep it idle up to its timeout). Set before the
# savepoint, so that rolling back to it keeps the bound.
_IDLE_BOUND = "SET LOCAL idle_in_transaction_session_timeout = {ms}"
_HANDLERS_PLANS = "SET LOCAL plan_cache_mode TO DEFAULT"
# A database outage fails every batch alike: at most one line per kind per 10 s.
_WARN = LogThrottle(10.0)


def _warn(kind: str, msg: str, *args: object) -> None:
    held = _WARN.allow(kind, time.monotonic())
    if held is not None:
        log.warning(msg + "%s", *args, _WARN.suffix(held))


# A connection the consumer holds a transaction on.
Conn = asyncpg.Connection | PoolConnectionProxy

# The lanes' cursors' move in a batch statement (inbox.advance_arg; None: rows from aside).
Advance = list[dict[str, Any]] | None
# One per process: what its consumers have seen lately (see ``ConsumerHealth``).
HEALTH = ConsumerHealth(time.monotonic)
# Dead items are looked at when no staged row is due, and at least this often.
ITEMS_EVERY_S = 1.0
# Rows put off while the day they need gets its partition.
PARTITION_RETRY_S = 0.05


class Deferred(Exception):
    """The database failed systemically (a probe confirmed it): nothing was written, the
    cursors stay, and the consumer waits ``delay`` before reading again."""

    def __init__(self, delay: float, cause: BaseException) -> None:
        self.delay = delay
        self.cause = cause
        super().__init__(describe(cause))


class Consumer:
    """One read-process-commit loop over its process's lanes, and over the webhooks and events
    moved aside."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        settings: Settings,
        *,
        rand: Callable[[], float] = random.random,
        health: ConsumerHealth | None = None,
        handlers: Registry | None = None,
        spacing: Spacing | None = None,
        lanes: LaneSet | None = None,
        member: str | None = None,
        loops: int = 1,
        on_more: Callable[[], None] | None = None,
        on_deliveries: Callable[[], None] | None = None,
    ) -> None:
        self._pool = pool
        # Shared by a process's consumers (their group passes one): woken batches start apart.
        self._spacing = spacing if spacing is not None else Spacing(settings.consumer_batch_gap_ms / 1000)
        self._s = settings
        self._rand = rand
        self._health = HEALTH if health is None else health
        if handlers is None and settings.handlers:
            handlers = load_handlers(settings.handlers)
        self._per_bot_tenants = frozenset(settings.reply_per_bot_tenants)
        self._handlers = handlers if handlers else None
        # The lanes are the group's (it leases them); a consumer made on its own leases its own.
        if lanes is None:
            self._lanes = LaneSet()
            self._lease: LaneLease | None = LaneLease(settings, self._lanes, member, greedy=True)
            self.member = self._lease.member
        else:
            assert member is not None
            self._lanes, self._lease, self.member = lanes, None, member
        self._loops = max(1, loops)
        self._idle_ms = int(settings.consumer_lane_lease_s * 1000 + settings.handler_timeout_ms)
        self._idle_bound = _IDLE_BOUND.format(ms=self._idle_ms)
        self._more_before = False  # the last batch left rows: read a share of the lanes
        self.deferred_s = 0.0  # the last step met a systemic fault: wait this long first
        self._items_at = -ITEMS_EVERY_S
        # The rows of the batch being handled, head first (until its transaction commits).
        self._claimed: list[int] = []
        # The scheduling state is this consumer's own; its group reads it and wakes it through
        # the methods below (``wake``, ``wake_if_idle``), never by setting it.
        self._woken = asyncio.Event()
        # The last step may have left work due right now: rows its batch did not reach (the
        # limit or the byte budget cut it), or dead items (it claimed some). Otherwise the loop
        # waits for a wake-up: a NOTIFY that came during the step sets it, and reading again at
        # once would find nothing.
        self._more = False
        self._again = False
        # True while the loop waits for a wake-up (a group wakes one idle consumer per NOTIFY).
        self._idle = False
        # True from a wake-up to the start of the batch it calls for (set when its group wakes
        # this one, and by the loop while it waits for its turn, Spacing): that batch will read
        # what a NOTIFY announces meanwhile, so the group wakes no other consumer for it.
        self._starting = False
        # Called when a batch left more due (a group wakes an idle sibling: a backlog is
        # drained in parallel, each loop on its share of the lanes).
        self._on_more = on_more
        # Called after a batch that may have inserted deliveries has committed: a forwarder in
        # the same process starts its round at once instead of waiting for the NOTIFY to come
        # round through PostgreSQL and its LISTEN connection (which still wakes the others).
        self._on_deliveries = on_deliveries

    # -- waking ---------------------------------------------------------------------------

    @property
    def idle(self) -> bool:
        """The loop waits for a wake-up."""
        return self._idle

    @property
    def starting(self) -> bool:
        """Woken, its batch not started yet: it will read what is announced meanwhile."""
        return self._starting

    def wake(self) -> None:
        """Look again now (a NOTIFY, lanes gained, a stop)."""
        self._woken.set()

    def wake_if_idle(self) -> bool:
        """Wake this consumer if it waits for a wake-up, its next batch counted as starting;
        False (and nothing done) if it does not wait."""
        if not self._idle:
            return False
        self._idle = False  # taken
        self._starting = True
        self._woken.set()
        return True

    # -- the loop -------------------------------------------------------------------------

    async def step(self) -> int:
        """One batch of the lanes' rows, then due dead items when idle or once a second; work done."""
        self._more = False
        try:
            n = await self.process_batch()
        except Deferred as d:
            # Nothing was written: the lanes are read again after the fault's backoff.
            self.deferred_s = d.delay
            return 0
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
                self._woken.clear()
                if not reserved:
                    self._spacing.started(clock())
                reserved = False
                self._starting = False
                try:
                    await self.step()
                except Exception as exc:
                    # Nothing could be recorded (the connection or the transaction is gone):
                    # the cursors did not move, so this consumer waits before reading again,
                    # with the same capped backoff, and counts no attempt anywhere; the row that
                    # headed the batch is remembered (a stall is taken alone).
                    self._uncommitted()
                    delay = self._fault(exc)
                    await back_off(stop, self._woken, delay, min(delay, s.retry_base_ms / 1000))
                    continue
                if self.deferred_s:
                    delay, self.deferred_s = self.deferred_s, 0.0
                    await back_off(stop, self._woken, delay, min(delay, s.retry_base_ms / 1000))
                    continue
                if self._again:
                    if self._more and self._on_more is not None:  # rows left: a sibling helps
                        self._on_more()
                    continue
                self._idle = True
                try:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._woken.wait(), poll_s)
                finally:
                    self._idle = False
                self._starting = True
                reserved = True
                delay = self._spacing.reserve(clock())
                if delay > 0:
                    await asyncio.sleep(delay)  # at most the gap: a stop is seen right after
        finally:
            beat.done()

    # -- the lanes ------------------------------------------------------------------------

    async def process_batch(self) -> int:
        """Read one batch of this process's lanes and handle it; returns the rows read (0: none).
        A consumer made on its own (tests, tools) holds the lanes for the batch only."""
        if self._lease is None:
            return await self._batch()
        async with self._pool.acquire() as conn:
            await self._lease.refresh(conn)
        try:
            return await self._batch()
        except asyncpg.PostgresError as exc:
            # Another consumer made on its own took these lanes meanwhile (it saw this one's
            # membership a moment late): its batch reads them; this one's committed nothing.
            if fenced(exc):
                return 0
            raise
        finally:
            async with self._pool.acquire() as conn:
                await self._lease.release(conn)

    async def _batch(self) -> int:
        stalled = self._health.stalled()
        if stalled is not None:
            return await self._alone(stalled)
        # A loop whose last batch left rows reads its share of the lanes, so that the siblings
        # it wakes read the rest in parallel; otherwise every free lane, in one statement.
        share = -(-len(self._lanes.cursors) // self._loops) if self._more_before else None
        taken = self._lanes.take(share)
        if not taken:
            return 0
        lanes_out = [c.lane for c in taken]
        moved: list[Cursor] | None = None
        started = time.perf_counter()
        try:
            async with self._pool.acquire() as conn:
                taken = await self._current(conn, taken)
                if not taken:
                    moved = []
                    return 0
                async with conn.transaction():
                    await inbox.read_mode(conn, idle_ms=self._idle_ms)
                    batch = await inbox.read(
                        conn, taken, limit=self._s.consumer_batch, max_bytes=self._s.consumer_batch_bytes
                    )
                    if not batch.rows or batch.snapshot is None:
                        # A window the last batch read up to its last row is read to its end:
                        # closed now, or the lane would keep reading it for ever, and never
                        # what committed after it.
                        windows = [c for c in taken if c.window is not None]
                        closed = {c.lane: c for c in close_windows(windows)}
                        if windows:
                            await inbox.advance(
                                conn, member=self.member, cursors=windows, moved=list(closed.values())
                            )
                        advance = [closed.get(c.lane, c) for c in taken]
                        more = False
                    else:
                        last = batch.rows[-1]
                        advance = advance_cursors(
                            taken, batch.snapshot, (last.txid, last.id), batch.exhausted
                        )
                        more = not batch.exhausted
                        forwards = await self._handle(conn, batch.rows, taken, advance)
                moved = advance
                self._more = self._more_before = more
                if not batch.rows:
                    return 0
        finally:
            self._lanes.give_back(lanes_out, moved)
        self._committed(forwards)
        metrics.CONSUMER_BATCH_ROWS.observe(len(batch.rows))
        metrics.CONSUMER_BATCH_SECONDS.observe(time.perf_counter() - started)
        return len(batch.rows)

    async def _current(self, conn: Conn, taken: list[Cursor]) -> list[Cursor]:
        """The cursors to read from: as cached, or read again for lanes whose last batch's fate
        is unknown (a lane this member no longer owns is dropped)."""
        stale = [c.lane for c in taken if c.lane in self._lanes.stale]
        if not stale:
            return taken
        fresh = {c.lane: c for c in await lanes_store.cursors(conn, lanes=stale, member=self.member)}
        self._lanes.refresh(fresh.values())
        gone = [lane for lane in stale if lane not in fresh]
        self._lanes.drop(gone)
        return [fresh.get(c.lane, c) for c in taken if c.lane not in gone]

    async def _handle(
        self,
        conn: Conn,
        rows: list[StagedRow],
        cursors: Sequence[Cursor] | None,
        moved: Sequence[Cursor] | None,
    ) -> bool:
        """The rows read, in the batch's transaction, with the lanes' cursors moving from
        ``cursors`` to ``moved`` (None: rows taken from the side table, no cursor moves);
        whether deliveries may be new."""
        self._claimed = [r.id for r in rows]
        advance = None if cursors is None or moved is None else inbox.advance_arg(cursors, moved)
        plan = plan_batch(rows)  # never raises
        try:
            # A savepoint of our own, not a nested transaction(): COMMIT releases it, one
            # round trip (RELEASE SAVEPOINT) fewer per batch.
            await conn.execute(f"SET LOCAL enable_sort = on; {self._idle_bound}; {_FAST_PATH}")
            with tracing.span("consumer.batch", rows=len(rows)):
                result = await self._fast(conn, plan, advance)
        except Exception as exc:
            if conn.is_closed() or fenced(exc):
                raise
            await conn.execute(f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}")
            await self._slow(conn, plan, exc, advance)
            return bool(plan.forwards)
        triage.observe(plan, result)
        return result.deliveries > 0

    def _committed(self, forwards: bool) -> None:
        self._health.succeeded(self._claimed)
        self._claimed = []
        if forwards and self._on_deliveries is not None:
            self._on_deliveries()

    def _uncommitted(self) -> None:
        if self._claimed:
            self._health.uncommitted(self._claimed[0])
        self._claimed = []

    async def _alone(self, inbox_id: int) -> int:
        """A row that headed batches that committed nothing, taken alone. Failing again where
        nothing can be recorded, it moves aside (that the database takes that shows the database
        works) and its lane's cursor passes it; a webhook already aside counts an attempt."""
        async with self._pool.acquire() as conn:
            row = await inbox.get_row(conn, inbox_id=inbox_id)
            aside = await inbox.parked_state(conn, inbox_id=inbox_id)
        if aside == "retry":
            return await self._alone_parked(inbox_id)
        lane = None if row is None else row.lane
        if row is None or aside is not None or lane not in self._lanes.cursors or lane in self._lanes.out:
            self._health.succeeded([inbox_id])  # gone, done, or not this process's to take now
            return 0
        taken = self._lanes.take_lane(lane)
        moved: list[Cursor] | None = None
        try:
            async with self._pool.acquire() as conn:
                taken = await self._current(conn, taken)
                async with conn.transaction():
                    await inbox.read_mode(conn, idle_ms=self._idle_ms)
                    batch = await inbox.read(conn, taken, limit=1, max_bytes=1)
                if not batch.rows or batch.rows[0].id != inbox_id or batch.snapshot is None:
                    # read by now, or not at the head of its lane any more: not stalled
                    self._health.succeeded([inbox_id])
                    moved = taken
                    return 0
                head = batch.rows[0]
                advance = advance_cursors(taken, batch.snapshot, (head.txid, head.id), exhausted=False)
                try:
                    async with conn.transaction():
                        forwards = await self._handle(conn, [head], taken, advance)
                except Exception as exc:
                    if fenced(exc) or not self._claimed:
                        raise
                    self._claimed = []
                    moved = await self._move_aside(head, taken, advance, exc)
                    self._health.succeeded([inbox_id])
                    return 1
                moved = advance
        finally:
            self._lanes.give_back([lane], moved)
        self._committed(forwards)
        return 1

    async def _move_aside(
        self, row: StagedRow, cursors: list[Cursor], advance: list[Cursor], exc: BaseException
    ) -> list[Cursor] | None:
        """``row`` leaves its lane for ``inbox_parked``, in a transaction of its own (on a fresh
        connection: the failed one may be gone); the cursors as they are now, None if unknown."""
        s = self._s
        delay = backoff_delay(1, s.retry_base_ms / 1000, s.retry_max_ms / 1000, self._rand)
        try:
            async with self._pool.acquire() as conn:
                state = await inbox.move_aside(
                    conn,
                    row=row,
                    member=self.member,
                    cursors=cursors,
                    moved=advance,
                    max_attempts=s.max_attempts,
                    delay_s=delay,
                    error=f"taken alone after batches that committed nothing: {describe(exc)}",
                )
        except Exception as failed:
            if fenced(failed):
                return None
            raise
        triage.moved_aside(row.id, state, exc)
        return advance

    async def _alone_parked(self, inbox_id: int) -> int:
        """A webhook aside that headed retries that committed nothing: one attempt counted, in a
        transaction of its own; dead at ``max_attempts``."""
        s = self._s
        delay = backoff_delay(1, s.retry_base_ms / 1000, s.retry_max_ms / 1000, self._rand)
        await triage.parked_attempt(self._pool, inbox_id=inbox_id, max_attempts=s.max_attempts, delay_s=delay)
        self._health.succeeded([inbox_id])
        return 1

    async def _fast(self, conn: Conn, plan: Plan, advance: Advance) -> inbox.Applied:
        result = await inbox.apply_plan(conn, plan, member=self.member, advance=advance)
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

    async def _slow(self, conn: Conn, plan: Plan, exc: BaseException, advance: Advance) -> None:
        """The fast path failed (rolled back to its savepoint): put off, or go event by event."""
        ids = [r.id for r, _ in plan.parsed] + plan.parked
        if classify(exc) is Fault.SYSTEM:
            source = plan.events[0][1].source if plan.events else "meta"
            kinds = {ev.kind for ev, _, _ in plan.events}
            confirmed = await triage.probe(self._pool, conn, exc, kinds, source)
            if confirmed is not None:
                raise Deferred(self._defer_delay(confirmed), confirmed) from exc
        metrics.CONSUMER_FALLBACKS.inc()
        _warn("fallback", "batch of %d rows failed (%s); retrying event by event", len(ids), describe(exc))
        try:
            async with conn.transaction():
                await self._per_event(conn, plan, advance)
        except Exception as inner:
            if conn.is_closed() or fenced(inner):
                raise
            cause = triage.cause(inner)
            raise Deferred(self._defer_delay(cause), cause) from inner

    async def _per_event(self, conn: Conn, plan: Plan, advance: Advance) -> None:
        """Each event in its own savepoint; an event's failure is its own unless the database
        reports a systemic error that a probe confirms (then SystemFault: put them all off)."""
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
        rows = Plan(parked=plan.parked, parked_why=plan.parked_why)
        try:
            async with conn.transaction():
                await dead_events.record(conn, new)
        except Exception as exc:
            # The items themselves cannot be stored: their rows move aside dead whole, bytes
            # intact (a replay finds the events that went through already done).
            await self._triage(conn, exc, "message")
            bad = {i.inbox_id for i in new}
            why = f"its failed events could not be recorded: {describe(exc)}"
            rows = Plan(
                parked=[*plan.parked, *sorted(bad)],
                parked_why=[*plan.parked_why, *(why for _ in bad)],
            )
            new = []
            metrics.DEAD_LETTERS.labels("unparseable").inc(len(bad))
        await inbox.apply_plan(conn, rows, member=self.member, advance=advance)
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

    def _defer_delay(self, exc: BaseException) -> float:
        """The system failed: how long before the lanes are read again (no attempt counted)."""
        return PARTITION_RETRY_S if missing_partition(exc) else self._fault(exc)

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
        """Retry due webhooks moved aside, then due dead items, each in its own savepoint;
        returns how many were claimed."""
        return await self._retry_parked() + await self._retry_dead_events()

    async def _retry_parked(self) -> int:
        async with self._pool.acquire() as conn, conn.transaction():
            await conn.execute(self._idle_bound)
            rows = await inbox.parked_claim(conn, limit=self._s.consumer_batch)
            done: list[int] = []
            for i, row in enumerate(rows):
                try:
                    async with conn.transaction():
                        forwards = await self._handle(conn, [row], None, None)
                except Deferred as d:
                    rest = [r.id for r in rows[i:]]
                    await inbox.parked_defer(conn, ids=rest, delay_s=d.delay, error=describe(d.cause))
                    break
                except Exception as exc:
                    if conn.is_closed():
                        raise
                    s = self._s
                    delay = backoff_delay(
                        row.attempts + 1, s.retry_base_ms / 1000, s.retry_max_ms / 1000, self._rand
                    )
                    await triage.parked_attempt(
                        conn, inbox_id=row.id, max_attempts=s.max_attempts, delay_s=delay, exc=exc
                    )
                else:
                    done.append(row.id)
                    if forwards and self._on_deliveries is not None:
                        self._on_deliveries()
            await inbox.parked_done(conn, ids=done)
        self._claimed = []
        if rows:
            self._health.succeeded([r.id for r in rows])
        return len(rows)

    async def _retry_dead_events(self) -> int:
        async with self._pool.acquire() as conn, conn.transaction():
            await conn.execute(self._idle_bound)
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
        with replying(self._per_bot_tenants):
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
