"""Consumers: read the lanes of ``webhook_inbox`` by cursor and act on each event exactly once.

A process's consumers own lanes (``gateway.inbound.lanes``) and read them in commit order
(``gateway.core.lanes``). A batch is one read (nothing locked, nothing written), the rows
applied (``gateway.inbound.applier``: one statement, the handlers, in parts narrowed down
to the events at fault when that fails), then COMMIT. A cursor moves only while this process
owns its lane as it read it, so a consumer that hung and lost its lanes commits nothing. When
no row is due, and at least once a second, it retries what was moved aside
(``gateway.inbound.retries``).

A row that heads batch after batch that commit nothing (its batch kills the connection, or
fails where nothing can be recorded) is taken alone after ``faults.STALL_CLAIMS`` such
batches; failing alone, it moves aside (``inbox_parked``, retried on its own with backoff,
dead after ``max_attempts``) and its lane's cursor passes it, while the rows behind it flow.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from gateway import metrics
from gateway.core.aio import back_off, wait_set
from gateway.core.backoff import backoff_delay
from gateway.core.errors import describe
from gateway.core.faults import ConsumerHealth, fenced
from gateway.core.heartbeat import HEARTBEATS
from gateway.core.lanes import Cursor, LaneSet, close_windows
from gateway.core.lanes import advance as advance_cursors
from gateway.core.planning import StagedRow
from gateway.core.settings import Settings
from gateway.core.spacing import Spacing
from gateway.handlers import Registry
from gateway.handlers import load as load_handlers
from gateway.inbound import triage
from gateway.inbound.applier import Applier, Conn, Deferred
from gateway.inbound.lanes import LaneLease
from gateway.inbound.retries import Retries
from gateway.store import deliveries, inbox
from gateway.store import lanes as lanes_store

# A consumer that hangs mid-transaction (SIGSTOP, a stuck event loop) keeps its connection, and
# with it the locks of its batch: the keys it inserted, the outbox rows it locked. Another
# consumer inserting the same key (a redelivery read in another lane) would wait for it for
# ever; the server ends such a transaction once it has been idle this long (its lanes are
# taken over after their lease; a handler may keep it idle up to its timeout). Set before the
# fast path's savepoint (``gateway.inbound.applier``), so that rolling back to it keeps the bound.
_IDLE_BOUND = "SET LOCAL idle_in_transaction_session_timeout = {ms}"

log = logging.getLogger(__name__)
# One per process: what its consumers have seen lately (see ``ConsumerHealth``).
HEALTH = ConsumerHealth(time.monotonic)
# Rows that share one batch's fixed cost well enough: a batch reads no further shard after it.
ENOUGH_ROWS = 50
# Dead items are looked at when no staged row is due (a step that read nothing, not one that
# found every lane out with its siblings), and at least this often.
ITEMS_EVERY_S = 1.0


def consumer_spacing(settings: Settings) -> Spacing:
    """The spacing of a process's woken consumer batches, from the settings."""
    return Spacing(
        settings.consumer_batch_gap_ms / 1000,
        settings.consumer_batch_gather,
        least_s=settings.consumer_batch_gap_min_ms / 1000,
    )


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
        woken: str = "",
    ) -> None:
        self._pool = pool
        # Shared by a process's consumers (their group passes one): woken batches start apart.
        if spacing is None:
            spacing = consumer_spacing(settings)
        self._spacing = spacing
        self._s = settings
        self._rand = rand
        self._health = HEALTH if health is None else health
        if handlers is None and settings.handlers:
            handlers = load_handlers(settings.handlers)
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
        # What each of its transactions sets first: the idle bound, and the forwarder that
        # ``on_deliveries`` wakes (``woken``: that forwarder skips the NOTIFY of the commit).
        self._tx_settings = _IDLE_BOUND.format(ms=self._idle_ms)
        if woken:
            self._tx_settings += "; " + deliveries.woken_by(woken)
        self._apply = Applier(
            pool,
            settings,
            rand=rand,
            health=self._health,
            handlers=handlers if handlers else None,
            member=self.member,
            tx_settings=self._tx_settings,
        )
        self._retries = Retries(
            pool,
            settings,
            self._apply,
            rand=rand,
            health=self._health,
            tx_settings=self._tx_settings,
            on_deliveries=on_deliveries,
        )
        self._more_before = False  # the last batch left rows: read a share of the lanes
        # The connection a loop of a group keeps from batch to batch (``_connection``), and
        # whether it may: set by ``run``, not by a bare ``step``.
        self._kept: PoolConnectionProxy[Any] | None = None
        self._keep = False
        self.deferred_s = 0.0  # the last step met a systemic fault: wait this long first
        self._items_at = -ITEMS_EVERY_S
        # The scheduling state is this consumer's own; its group reads it and wakes it through
        # the methods below (``wake``, ``wake_if_idle``), never by setting it.
        self._woken = asyncio.Event()
        # The last step may have left work due right now: rows its batch did not reach (the
        # limit or the byte budget cut it), or dead items (it claimed some). Otherwise the loop
        # waits for a wake-up: a NOTIFY that came during the step sets it, and reading again at
        # once would find nothing.
        self._more = False
        self._unread_shards = False  # the last batch left shards unread
        self._no_free_lane = False  # the last step found every lane out with a sibling
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
        """One batch of the lanes' rows, then due dead items when idle or once a second; work done.
        A loop that found every lane out with its siblings is not idle: they are at work."""
        self._more = False
        self._unread_shards = False
        self._no_free_lane = False
        try:
            n = await self.process_batch()
        except Deferred as d:
            # Nothing was written: the lanes are read again after the fault's backoff.
            self.deferred_s = d.delay
            return 0
        items = 0
        now = time.monotonic()
        if (n == 0 and not self._no_free_lane) or now - self._items_at >= ITEMS_EVERY_S:
            self._items_at = now
            await self._let_go()  # the items take connections of their own
            items = await self.process_items()
            n += items
        self._again = self._more or self._unread_shards or items > 0
        return n

    async def run(self, stop: asyncio.Event) -> None:
        s = self._s
        poll_s = s.consumer_poll_ms / 1000
        # A turn is one batch (bounded by the driver's command timeout), then at most a fault
        # backoff or a poll interval: silent longer than that and GATEWAY_LIVENESS_S, it is stuck.
        beat = HEARTBEATS.loop("consumer", s.liveness_s + s.fault_backoff_max_ms / 1000 + poll_s)
        clock = asyncio.get_running_loop().time
        reserved = False  # this step's start was reserved after a wake-up
        self._keep = self._lease is None  # a group's loop: no other acquire of its own per batch
        try:
            while not stop.is_set():
                beat()
                self._woken.clear()
                if not reserved:
                    self._spacing.started(clock())
                reserved = False
                self._starting = False
                try:
                    n = await self.step()
                except Exception as exc:
                    # Nothing could be recorded (the connection or the transaction is gone):
                    # the cursors did not move, so this consumer waits before reading again,
                    # with the same capped backoff, and counts no attempt anywhere; the row that
                    # headed the batch is remembered (a stall is taken alone).
                    self._uncommitted()
                    delay = self._apply.fault(exc)
                    await back_off(stop, self._woken, delay, min(delay, s.retry_base_ms / 1000))
                    continue
                self._spacing.counted(clock(), n)
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
                    if not await wait_set(self._woken, poll_s):
                        await self._let_go()  # quiet for a poll interval: the pool has it back
                finally:
                    self._idle = False
                self._starting = True
                reserved = True
                delay = self._spacing.reserve(clock())
                if delay > 0:
                    await asyncio.sleep(delay)  # at most the gap: a stop is seen right after
        finally:
            self._keep = False
            await self._let_go()
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
            await self._let_go()  # taken alone on connections of its own
            return await self._alone(stalled)
        # A loop whose last batch left rows reads its share of the lanes, so that the siblings
        # it wakes read the rest in parallel; otherwise every free lane, in one statement.
        share = -(-len(self._lanes.cursors) // self._loops) if self._more_before else None
        # One statement reads the lanes of one shard (on Citus a router query on the worker
        # whose snapshot it takes; on one server every lane is in shard 0). A step reads shard
        # after shard, taking each one's lanes as it comes to them, until its batch is full or
        # no free shard is left, and applies what they held in one transaction: an empty step
        # means every shard was empty.
        tried: set[int] = set()

        def take() -> list[Cursor]:
            taken = self._lanes.take(share, skip=tried)
            if taken:
                tried.add(self._lanes.shards.get(taken[0].lane, 0))
            return taken

        n = await self._read(take)
        # Shards this step did not reach (its batch was full, or a sibling loop held their
        # lanes) may hold rows: the next step comes at once, not after a poll interval.
        self._unread_shards = n > 0 and bool(set(self._lanes.shards.values()) - tried)
        return n

    async def _read(self, take: Callable[[], list[Cursor]]) -> int:
        """One batch of the lanes ``take`` hands out (a shard's at a time, each read by a
        statement of its own), handled in one transaction; the rows read."""
        # The first lanes are taken before a connection: a loop woken (a NOTIFY wakes an idle
        # loop) while its siblings hold every lane reads nothing and opens no transaction; take
        # marks those lanes wanted, so their holder reads them again after its batch.
        first = take()
        self._no_free_lane = not first
        if not first:
            self._more_before = False
            return 0
        out: list[int] = [c.lane for c in first]
        pending = [first]

        def more_lanes() -> list[Cursor]:
            if pending:
                return pending.pop()  # its lanes are in ``out`` already
            taken = take()
            out.extend(c.lane for c in taken)
            return taken

        moved: list[Cursor] | None = None
        started = time.perf_counter()
        rows: list[StagedRow] = []
        forwards = False
        try:
            async with self._connection() as conn, conn.transaction():
                if conn is not self._kept:  # a kept connection has the read's mode for its session
                    await inbox.read_mode(conn, idle_ms=self._idle_ms)
                read, more = await self._read_shards(conn, more_lanes)
                rows = [r for _, batch, _ in read for r in batch]
                if rows:
                    handled = [(taken, adv) for taken, batch, adv in read if batch]
                    forwards = await self._apply.handle(
                        conn,
                        rows,
                        [c for taken, _ in handled for c in taken],
                        [c for _, adv in handled for c in adv],
                    )
            moved = [c for _, _, adv in read for c in adv]
            self._more = self._more_before = more
        finally:
            self._give_back(out, moved)
        if not rows:
            return 0
        self._committed(forwards)
        metrics.CONSUMER_BATCH_ROWS.observe(len(rows))
        metrics.CONSUMER_BATCH_SECONDS.observe(time.perf_counter() - started)
        return len(rows)

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[Conn]:
        """A batch's connection. A loop of a group keeps one from batch to batch while it is
        busy, with the read's mode set once for the session: no ``read_mode`` and no pool reset
        (``RESET ALL; CLOSE ALL; UNLISTEN *; pg_advisory_unlock_all()``) per batch, two of a
        batch's seven round trips. A batch that raises gives it back (the pool resets or drops
        it). Otherwise, one from the pool for the batch."""
        if not self._keep:
            async with self._pool.acquire() as conn:
                yield conn
            return
        kept, fresh = self._kept, self._kept is None
        if kept is None:
            kept = self._kept = await self._pool.acquire()
        try:
            if fresh:
                await inbox.read_mode(kept, idle_ms=self._idle_ms, session=True)
            yield kept
        except BaseException:
            await self._let_go()
            raise

    async def _let_go(self) -> None:
        """The kept connection back to the pool, which resets its session. Never raises: a
        connection whose reset fails (its server gone, as in a failover) is dropped by the pool,
        and the loop goes on (it is called outside a step's error handling too)."""
        conn, self._kept = self._kept, None
        if conn is None:
            return
        try:
            await self._pool.release(conn)
        except Exception as exc:
            log.info("consumer: a kept connection was dropped: %s", describe(exc))

    async def _read_shards(
        self, conn: Conn, take: Callable[[], list[Cursor]]
    ) -> tuple[list[tuple[list[Cursor], list[StagedRow], list[Cursor]]], bool]:
        """The lanes ``take`` hands out, read in the caller's transaction while the batch's
        limits (rows, bytes) last. Per read: its cursors, its rows and where its cursors go; and
        whether a read left rows. Windows a read found empty are closed here."""
        limit, budget = self._s.consumer_batch, self._s.consumer_batch_bytes
        # Once ENOUGH_ROWS are read (or a quarter of a smaller limit), no further shard is
        # read: ``limit`` left at ``rest`` or below. A backlog's batches then stay one shard's:
        # on a cluster, two loops' batches of several full shards each were cancelled as
        # distributed deadlocks again and again, and a backlog drained 5 to 10 times slower.
        rest = limit - min(ENOUGH_ROWS, max(1, limit // 4))
        read: list[tuple[list[Cursor], list[StagedRow], list[Cursor]]] = []
        more = False
        while limit > rest and budget > 0:
            taken = take()
            if not taken:
                break
            taken = await self._current(conn, taken)
            if not taken:
                continue
            batch = await inbox.read(conn, taken, limit=limit, max_bytes=budget)
            if not batch.rows:
                # A window the last batch read up to its last row is read to its end: closed
                # now, or the lane would keep reading it for ever, and never what committed
                # after it.
                windows = [c for c in taken if c.window is not None]
                closed = {c.lane: c for c in close_windows(windows)}
                if windows:
                    await inbox.advance(
                        conn, member=self.member, cursors=windows, moved=list(closed.values())
                    )
                read.append((taken, [], [closed.get(c.lane, c) for c in taken]))
                continue
            last = batch.rows[-1]
            advance = advance_cursors(taken, batch.snapshots, (last.txid, last.id), batch.exhausted)
            read.append((taken, batch.rows, advance))
            more = more or not batch.exhausted
            limit -= len(batch.rows)
            budget -= sum(len(r.body) for r in batch.rows)
        return read, more

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

    def _give_back(self, lanes: list[int], moved: list[Cursor] | None) -> None:
        """Lanes back to the process; read again soon if a sibling looked for them meanwhile
        (what woke it may have committed there after this loop's read began)."""
        if self._lanes.give_back(lanes, moved):
            self._woken.set()

    def _committed(self, forwards: bool) -> None:
        self._health.succeeded(self._apply.claimed)
        self._apply.claimed = []
        if forwards and self._on_deliveries is not None:
            self._on_deliveries()

    def _uncommitted(self) -> None:
        if self._apply.claimed:
            self._health.uncommitted(self._apply.claimed[0])
        self._apply.claimed = []

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
                if not batch.rows or batch.rows[0].id != inbox_id:
                    # read by now, or not at the head of its lane any more: not stalled
                    self._health.succeeded([inbox_id])
                    moved = taken
                    return 0
                head = batch.rows[0]
                advance = advance_cursors(taken, batch.snapshots, (head.txid, head.id), exhausted=False)
                try:
                    async with conn.transaction():
                        forwards = await self._apply.handle(conn, [head], taken, advance)
                except Exception as exc:
                    if fenced(exc) or not self._apply.claimed:
                        raise
                    self._apply.claimed = []
                    moved = await self._move_aside(head, taken, advance, exc)
                    self._health.succeeded([inbox_id])
                    return 1
                moved = advance
        finally:
            self._give_back([lane], moved)
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

    # -- moved aside ----------------------------------------------------------------------

    async def process_items(self) -> int:
        """Retry due webhooks moved aside, then due dead items, each in its own savepoint;
        returns how many were claimed."""
        return await self._retries.due()
