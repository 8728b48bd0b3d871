"""Applying the rows a consumer read, in its transaction, and what happens when that fails.

Fast path, a constant number of statements per batch whatever its size: one statement that
inserts every key into ``processed_webhook_events``, applies side effects only for the keys it
newly inserted and moves the lanes' cursors past the batch, then the handlers of the fresh
events (if any are configured). It runs under a savepoint, so when it fails the failure is
recorded in the same transaction that moves the cursors. What is recorded depends on where the
failure came from (``gateway.core.faults``):

- parsing and planning never fail a batch: a body that is no payload moves aside dead at once
  (``inbox_parked``), a fragment or event that cannot be planned is a dead item at once, with
  its bytes;
- anything raised while applying one event is that event's: the batch is applied again in
  parts, each in its own savepoint, halved until the events at fault are alone
  (``gateway.core.narrowing``; an event whose handler raised is known at once). The good
  events commit and the cursors pass the batch; an event that fails becomes a
  ``dead_events`` item (its raw fragment, its key, the error);
- only an error the database reports as systemic pauses the pipeline, and only when a probe
  (harmless events of the same kinds, applied and rolled back) fails too: nothing is written,
  the cursors stay, and the consumer backs off (``Deferred``). A day that has no partition
  yet is created on the spot.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from gateway import metrics, tracing
from gateway.core.backoff import backoff_delay
from gateway.core.errors import describe
from gateway.core.events import Event, Item, Status, event_day
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
from gateway.core.jsonspan import pointer
from gateway.core.lanes import Cursor
from gateway.core.limits import LogThrottle
from gateway.core.narrowing import narrow
from gateway.core.planning import Plan, StagedRow, plan_batch
from gateway.core.settings import Settings
from gateway.handlers import Registry, replying
from gateway.inbound import triage
from gateway.inbound.dead_items import Failure, bad_item, failed_item, raw_fragment
from gateway.store import db, dead_events, inbox

# The consumer's log: its lines keep the consumer's name wherever the code that writes them is.
log = logging.getLogger("gateway.inbound.consumer")
# The fast path's savepoint (one per transaction: a batch is one transaction).
_SAVEPOINT = "gateway_consumer_batch"
# The batch statement is planned once per connection, not per batch: a custom plan of its
# fifteen CTEs over partitioned tables costs about 2 ms, more than executing a small batch.
# Its parameters are arrays and JSON whose contents a custom plan does not look at either,
# and no partition key is among them. Local to the fast path: ROLLBACK TO SAVEPOINT undoes it
# for the event-by-event path, and handlers' own statements get the session's setting back.
# Every lookup the statement makes is by an index; a seq scan is planned only for a partition
# that was small when the plan was made (a new day's, or any before a burst) and stays in the
# plan cached on the connection while the partition grows: each message's dedup check then read
# the whole day's inbound_messages (a 30 000-webhook burst after a 300-row ANALYZE drained at
# 664/s, each batch slower than the last; 9 600/s without seq scans).
_FAST_PATH = (
    f"SAVEPOINT {_SAVEPOINT}; SET LOCAL plan_cache_mode = force_generic_plan; SET LOCAL enable_seqscan = off"
)
# On a Citus coordinator the statement is planned for each batch: Citus plans a distributed
# statement only with its parameters' values ("could not create distributed plan").
_FAST_PATH_CITUS = f"SAVEPOINT {_SAVEPOINT}"
_HANDLERS_PLANS = "SET LOCAL plan_cache_mode TO DEFAULT; SET LOCAL enable_seqscan TO DEFAULT"
# A batch goes without forwards (no envelope per event: a sixth of planning a batch, and the
# text sent with it) unless destinations took events, or the statement refused a batch without
# them (SQLSTATE GWF01, sql/functions/forwards_withheld.sql), in the last FORWARDING_S
# seconds. The refused batch is planned again with them in the same transaction, so events are
# never missed; with destinations enabled that want none of the events, one batch a minute
# is applied twice.
FORWARDING_S = 60.0
_WITHHELD = "GWF01"
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
# An event planned in a batch, with the row and the fragment it came from.
Planned = tuple[Event, StagedRow, Item]
# Rows put off while the day they need gets its partition.
PARTITION_RETRY_S = 0.05


class _AtEvent(Exception):
    """A handler raised on the event at ``index`` of the events being applied (``cause``)."""

    def __init__(self, index: int, cause: Exception) -> None:
        self.index = index
        self.cause = cause
        super().__init__(str(cause))


def _at_event(exc: Exception) -> tuple[int | None, Exception]:
    """The event a failure is known to belong to (None: not known), and the failure itself."""
    return (exc.index, exc.cause) if isinstance(exc, _AtEvent) else (None, exc)


class Deferred(Exception):
    """The database failed systemically (a probe confirmed it): nothing was written, the
    cursors stay, and the consumer waits ``delay`` before reading again."""

    def __init__(self, delay: float, cause: BaseException) -> None:
        self.delay = delay
        self.cause = cause
        super().__init__(describe(cause))


class Applier:
    """One consumer's way of applying rows in a transaction it holds: the fast path, event by
    event when that fails, the handlers, and the count and backoff of what failed."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        settings: Settings,
        *,
        rand: Callable[[], float],
        health: ConsumerHealth,
        handlers: Registry | None,
        member: str,
        tx_settings: str,
    ) -> None:
        self._pool = pool
        self._s = settings
        self._rand = rand
        self._health = health
        self._per_bot_tenants = frozenset(settings.reply_per_bot_tenants)
        self.handlers = handlers
        self._member = member
        self._tx_settings = tx_settings
        self._citus: bool | None = None  # the database is a Citus coordinator (asked once)
        # Render bodies for destinations in this process (gateway.core.envelope.forward_row):
        # while the last batch queued deliveries. Never a question of correctness (a batch
        # without bodies has them rendered by its statement), only of where the work is done:
        # without destinations, nowhere.
        self._bodies = False
        self._forwarding_until = 0.0  # time.monotonic() until which batches carry forwards
        # The rows being handled, head first (until their transaction commits).
        self.claimed: list[int] = []

    async def handle(
        self,
        conn: Conn,
        rows: list[StagedRow],
        cursors: Sequence[Cursor] | None,
        moved: Sequence[Cursor] | None,
    ) -> bool:
        """The rows read, in the batch's transaction, with the lanes' cursors moving from
        ``cursors`` to ``moved`` (None: rows taken from the side table, no cursor moves);
        whether deliveries may be new."""
        self.claimed = [r.id for r in rows]
        advance = None if cursors is None or moved is None else inbox.advance_arg(cursors, moved)
        forwarding = time.monotonic() < self._forwarding_until
        plan = plan_batch(rows, bodies=self._bodies, forwarding=forwarding)  # never raises
        fast_path = _FAST_PATH_CITUS if await self.on_citus(conn) else _FAST_PATH
        while True:
            try:
                # A savepoint of our own, not a nested transaction(): COMMIT releases it, one
                # round trip (RELEASE SAVEPOINT) fewer per batch.
                await conn.execute(f"SET LOCAL enable_sort = on; {self._tx_settings}; {fast_path}")
                with tracing.span("consumer.batch", rows=len(rows)):
                    result = await self._fast(conn, plan, advance)
                break
            except Exception as exc:
                at, exc = _at_event(exc)
                if conn.is_closed() or fenced(exc):
                    raise
                await conn.execute(f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}")
                if not plan.forwarding and getattr(exc, "sqlstate", None) == _WITHHELD:
                    metrics.CONSUMER_FORWARDS_REDONE.inc()
                    self._forwarding_until = time.monotonic() + FORWARDING_S
                    plan = plan_batch(rows, bodies=self._bodies)
                    continue
                await self._slow(conn, plan, exc, at, advance)
                return bool(plan.events)
        triage.observe(plan, result)
        self._bodies = result.deliveries > 0
        if self._bodies:
            self._forwarding_until = time.monotonic() + FORWARDING_S
        return result.deliveries > 0

    async def on_citus(self, conn: Conn) -> bool:
        """Whether the database is a Citus coordinator (asked the first time only)."""
        if self._citus is None:
            self._citus = (await db.citus_state(conn))[0]
        return self._citus

    async def _fast(self, conn: Conn, plan: Plan, advance: Advance) -> inbox.Applied:
        citus = await self.on_citus(conn)
        result = await inbox.apply_plan(conn, plan, member=self._member, advance=advance, citus=citus)
        if plan.bad:
            await dead_events.record(conn, [bad_item(row, item) for row, item in plan.bad])
        await self._fragments(conn, [(ev, row, item) for ev, row, item in plan.events if item.scrubbed])
        if self.handlers and result.fresh_keys:
            await conn.execute(_HANDLERS_PLANS)
            await self._handlers(conn, plan.events, result)
        return result

    async def _handlers(self, conn: Conn, events: Sequence[Planned], result: inbox.Applied) -> None:
        """The handlers of the fresh ``events``, in order; raises ``_AtEvent`` naming the event
        whose handler raised."""
        fresh = set(result.fresh_keys)
        for i, (ev, _row, _item) in enumerate(events):
            if ev.key in fresh:
                try:
                    await self.run_handlers(conn, ev, result.callers)
                except Exception as exc:
                    raise _AtEvent(i, exc) from exc

    async def _slow(
        self, conn: Conn, plan: Plan, exc: BaseException, at: int | None, advance: Advance
    ) -> None:
        """The fast path failed (rolled back to its savepoint; ``at``: the event whose handler
        raised, when known): put off, or narrow the failure down to the events at fault."""
        ids = [r.id for r, _ in plan.parsed] + plan.parked
        if classify(exc) is Fault.SYSTEM:
            source = plan.events[0][1].source if plan.events else "meta"
            kinds = {ev.kind for ev, _, _ in plan.events}
            confirmed = await triage.probe(self._pool, conn, exc, kinds, source)
            if confirmed is not None:
                raise Deferred(self._defer_delay(confirmed), confirmed) from exc
        metrics.CONSUMER_FALLBACKS.inc()
        _warn("fallback", "batch of %d rows failed (%s); retrying it in parts", len(ids), describe(exc))
        try:
            async with conn.transaction():
                await self._per_event(conn, plan, exc, at, advance)
        except Exception as inner:
            if conn.is_closed() or fenced(inner):
                raise
            cause = triage.cause(inner)
            raise Deferred(self._defer_delay(cause), cause) from inner

    async def _per_event(
        self, conn: Conn, plan: Plan, exc: BaseException, at: int | None, advance: Advance
    ) -> None:
        """The batch's events, which failed together with ``exc``, in parts narrowed down to the
        events at fault; an event's failure is its own unless the database reports a systemic
        error that a probe confirms (then SystemFault: put them all off)."""
        failures: list[Failure] = []
        await self._failed(conn, plan.events, exc, at, failures)
        new = [bad_item(row, item) for row, item in plan.bad]
        for f in failures:
            v = verdict(f.fault, probe_failed=False)
            new.append(failed_item(f, v, max_attempts=self._s.max_attempts, delay=self.item_delay))
        rows = Plan(parked=plan.parked, parked_why=plan.parked_why)
        try:
            async with conn.transaction():
                await dead_events.record(conn, new)
        except Exception as exc:
            # The items themselves cannot be stored: their rows move aside dead whole, bytes
            # intact (a replay finds the events that went through already done).
            await self.event_fault(conn, exc, "message")
            bad = {i.inbox_id for i in new}
            why = f"its failed events could not be recorded: {describe(exc)}"
            rows = Plan(
                parked=[*plan.parked, *sorted(bad)],
                parked_why=[*plan.parked_why, *(why for _ in bad)],
            )
            new = []
            metrics.DEAD_LETTERS.labels("unparseable").inc(len(bad))
        await inbox.apply_plan(conn, rows, member=self._member, advance=advance, citus=bool(self._citus))
        for i in new:
            self.count_item(i.state, i.deferrals > 0, i.kind)

    async def _failed(
        self,
        conn: Conn,
        events: Sequence[Planned],
        exc: BaseException,
        at: int | None,
        failures: list[Failure],
    ) -> None:
        """``events`` failed together with ``exc`` (``at``: the one whose handler raised): record
        the event now known to be at fault, then try the others in parts."""
        fault_at, parts = narrow(len(events), at)
        if fault_at is not None:
            ev, row, item = events[fault_at]
            failures.append(Failure(row, item, ev, exc, await self.event_fault(conn, exc, ev.kind)))
        for start, end in parts:
            await self._part(conn, events[start:end], failures)

    async def _part(self, conn: Conn, events: Sequence[Planned], failures: list[Failure]) -> None:
        """Apply ``events`` together in a savepoint; if that fails, narrow it down."""
        try:
            async with conn.transaction():
                part = Plan()
                for ev, row, _item in events:
                    part.add(ev, row.id, row.source, event_day(ev, row.source))
                result = await inbox.apply_plan(conn, part, citus=bool(self._citus))
                await self._fragments(conn, [e for e in events if e[2].scrubbed])
                if self.handlers and result.fresh_keys:
                    await self._handlers(conn, events, result)
        except Exception as exc:
            at, exc = _at_event(exc)
            if conn.is_closed():
                raise exc
            if len(events) > 1 and classify(exc) is Fault.SYSTEM:
                # The whole database failing fails every part alike: confirm it here, not by
                # narrowing down to one event first.
                kinds = {ev.kind for ev, _, _ in events}
                confirmed = await triage.probe(self._pool, conn, exc, kinds, events[0][1].source)
                if confirmed is not None:
                    raise triage.SystemFault(confirmed) from exc
            await self._failed(conn, events, exc, at, failures)
            return
        fresh = set(result.fresh_keys)
        for ev, _, _ in events:
            metrics.CONSUMER_EVENTS.labels(ev.kind, "processed" if ev.key in fresh else "duplicate").inc()

    async def event_fault(self, conn: Conn, exc: BaseException, kind: str) -> Fault:
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
        return PARTITION_RETRY_S if missing_partition(exc) else self.fault(exc)

    def fault(self, exc: BaseException) -> float:
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

    # -- helpers --------------------------------------------------------------------------

    async def run_handlers(self, conn: Conn, ev: Event, callers: dict[str, str]) -> None:
        """Run the handlers of ``ev``; a status gets the caller's biz_opaque_callback_data."""
        assert self.handlers is not None
        if isinstance(ev, Status) and ev.key in callers:
            ev = dataclasses.replace(ev, biz_opaque_callback_data=callers[ev.key])
        timeout = self._s.handler_timeout_ms / 1000
        with replying(self._per_bot_tenants):
            for h in self.handlers.for_event(ev):
                try:
                    async with asyncio.timeout(timeout):  # not wait_for: core.aio.wait_set says why
                        await h.fn(ev, conn)
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

    def item_delay(self, v: Verdict, attempts: int, deferrals: int) -> float:
        s = self._s
        if v is Verdict.DEFER:
            return fault_delay(deferrals, s.retry_base_ms / 1000, s.fault_backoff_max_ms / 1000, self._rand)
        return backoff_delay(max(attempts, 1), s.retry_base_ms / 1000, s.retry_max_ms / 1000, self._rand)

    def count_item(self, state: str, deferred: bool, kind: str) -> None:
        if state == dead_events.DEAD:
            metrics.DEAD_LETTERS.labels("bad_fragment" if kind == "bad" else "max_attempts").inc()
        elif not deferred:
            metrics.CONSUMER_FAILURES.inc()
