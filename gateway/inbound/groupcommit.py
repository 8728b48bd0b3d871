"""Group commit: rows from concurrent requests share one INSERT and one COMMIT.

When no batch is being written (the database is idle), rows are written at the end of the
event-loop pass that staged them, so the requests read in one pass share a batch, or a moment
later (``linger``) when the recent rate of rows says others are likely to come in that moment:
at a few hundred webhooks a second each would otherwise be its own transaction, with its own
COMMIT, WAL flush and NOTIFY (``core.spacing.linger``: none below ~42 rows/s with the default
12 ms, and no longer than ``linger_gather`` more rows take). While a batch is being written,
new rows wait for it: they go as one batch when it is done (when their linger, counted from
the first one's arrival, is over), or as a batch of their own (up to ``max_inflight`` in
flight) once the first of them has waited ``window`` seconds (or its linger, if longer), or as
soon as ``max_batch`` rows wait. So the batch size follows the commit latency, and batches get
bigger exactly when the database is the bottleneck.

Every row carries its acknowledgement deadline. The deadline is enforced per batch (one
timer for the whole write) and for rows still waiting for a free slot, not per request:
a timer per request was the largest single cost of the ack path. For the same reason each
write slot owns its connection instead of borrowing one from a pool: acquire and release
cost about as much CPU as the INSERT itself.

A batch is one statement in its own implicit transaction, so a connection lost while it runs
(a failover, the server killed) leaves its COMMIT's fate unknown: every row of it is answered
503, never 200, and a copy Meta redelivers is absorbed by deduplication if it had committed.
A lost connection is replaced at the next batch (``connect``: the writable primary of the
moment).

Each batch is staged into one lane, the next one after the previous batch's (starting at a
random lane, so that several committers spread): on Citus a lane is on one shard, so a batch
is one shard's insert, committed in one phase. Its COMMIT on the worker may fail after the
statement was sent it (the worker lost): Citus then only warns, and the coordinator commits;
the committer takes that warning as a lost connection (503). A lane whose batch failed is passed
over for ``LANE_REST_S``: a Citus worker that is down fails only the batches of the lanes whose
shards it holds, and those lanes are avoided while it is.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import asyncpg

from gateway import metrics, tracing
from gateway.core.faults import missing_partition
from gateway.core.limits import LogThrottle
from gateway.core.settings import Settings
from gateway.core.spacing import Rate, Senders, linger
from gateway.store import db, doubt, inbox, retention

log = logging.getLogger(__name__)
# A database outage fails every batch: one line per 10 s says so, with how many were held back.
_WARN = LogThrottle(10.0)
LANES = 32  # webhook_inbox's lanes (its CHECK constraint)
# How long a lane whose batch failed is passed over (unless every lane failed lately): with
# one of two Citus workers stopped, 64 webhooks staged one by one lost 31 batches to a 5 s rest
# (each lane of the stopped worker failed again every 5 s) and 15 to a 30 s one.
LANE_REST_S = 30.0


class Unavailable(Exception):
    """The row was not confirmed committed: database down or slow, or the committer closed."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(slots=True)
class _Item:
    source: str
    body: bytes
    delivery_id: str | None
    deadline: float
    future: asyncio.Future[None] = field(repr=False)
    link: Any = field(default=None, repr=False)  # the request's span context, when tracing


Connect = Callable[[], Awaitable[asyncpg.Connection]]
# The settings' defaults are the committer's: a caller that passes none gets what an operator
# who sets none gets (linger excepted: none unless asked for, so tests see one batch per pass).
_DEFAULTS = Settings()


class GroupCommitter:
    def __init__(
        self,
        connect: Connect,
        *,
        window_s: float = _DEFAULTS.commit_window_ms / 1000,
        linger_s: float = 0.0,
        linger_gather: int = _DEFAULTS.commit_linger_gather,
        others_s: float = 1.0,
        max_batch: int = _DEFAULTS.commit_max_batch,
        max_inflight: int = _DEFAULTS.commit_max_inflight,
        deadline_s: float = _DEFAULTS.ack_deadline_ms / 1000,
    ) -> None:
        self._connect = connect
        self._idle: list[asyncpg.Connection] = []  # at most max_inflight connections exist
        self._window = window_s
        self._linger = linger_s
        self._gather = linger_gather  # a lingering row waits at most for this many more
        self._senders = Senders(others_s)  # rows linger only while several connections send
        self._rate = Rate()  # rows staged a second, recently (the linger's guess)
        self._max_batch = max_batch
        self._max_inflight = max_inflight
        self._deadline = deadline_s
        self._pending: list[_Item] = []
        self._timer: asyncio.Handle | None = None  # the next flush: this pass's end, or the window
        self._due = 0.0  # loop time the pending rows' linger ends (from the first one's arrival)
        self._overdue = False  # pending rows whose window passed while every slot was busy
        self._expiry: asyncio.TimerHandle | None = None
        self._inflight = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self.batches_written = 0
        self._failing: tuple[float, int] | None = None  # since when, and how many batches failed
        self._lane = random.randrange(LANES)  # the lane of the last batch cut
        self._resting: dict[int, float] = {}  # lane -> until when it is passed over
        self._citus: bool | None = None  # the database is a Citus coordinator (asked once)

    def _next_lane(self) -> int:
        """The next lane after the last batch's that has not failed lately (any, if all have)."""
        now = time.monotonic()
        for step in range(1, LANES + 1):
            lane = (self._lane + step) % LANES
            if self._resting.get(lane, 0.0) <= now:
                break
        else:
            lane = (self._lane + 1) % LANES
        self._lane = lane
        return lane

    @cached_property
    def _loop(self) -> asyncio.AbstractEventLoop:
        """The loop of its first row: it is built with the app, before the app's loop runs."""
        return asyncio.get_running_loop()

    @property
    def pending(self) -> int:
        """Rows waiting for a batch to be cut."""
        return len(self._pending)

    def stage(
        self, source: str, body: bytes, delivery_id: str | None = None, client: int | None = None
    ) -> asyncio.Future[None]:
        """Queue one row; the future resolves after COMMIT, or raises Unavailable. ``client``
        names the connection it came on (None: unknown, as if others were sending too)."""
        if self._closed:
            raise Unavailable("closed")
        loop = self._loop
        fut: asyncio.Future[None] = loop.create_future()
        link = tracing.current_context() if tracing.enabled else None
        now = loop.time()
        self._pending.append(_Item(source, body, delivery_id, now + self._deadline, fut, link))
        if self._linger:
            self._rate.counted(now, 1)
            self._senders.seen(now, client)
        if len(self._pending) >= self._max_batch:
            self._flush()
        elif self._timer is None and not self._overdue:
            # Only other connections can bring company (core.spacing.Senders).
            most = self._linger if self._senders.several(now) else 0.0
            wait = linger(self._rate.at(now), most, self._gather)
            self._due = now + wait
            if self._inflight:
                self._timer = loop.call_later(max(self._window, wait), self._flush)
            elif wait:
                self._timer = loop.call_later(wait, self._flush)
            else:  # nothing being written: at the end of this pass, not after a window
                self._timer = loop.call_soon(self._flush)
        return fut

    def _flush(self, force: bool = False) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        while self._pending and (force or self._inflight < self._max_inflight):
            batch = self._pending[: self._max_batch]
            del self._pending[: self._max_batch]
            self._inflight += 1
            task = self._loop.create_task(self._write(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        # Rows left over have had their window; they go as soon as a slot frees.
        self._overdue = bool(self._pending)
        if self._pending and self._expiry is None:
            # Every slot is busy: make sure waiting rows still answer by their deadline.
            self._expiry = self._loop.call_at(self._pending[0].deadline, self._expire)

    def _release(self) -> None:
        """Nothing is being written: the pending rows go when their linger ends."""
        if self._due <= self._loop.time():
            self._flush()
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._loop.call_at(self._due, self._flush)

    def _expire(self) -> None:
        self._expiry = None
        now = self._loop.time()
        expired = 0
        while expired < len(self._pending) and self._pending[expired].deadline <= now:
            expired += 1
        if expired:
            _fail(self._pending[:expired], Unavailable("timeout"))
            del self._pending[:expired]
        if self._pending:
            self._expiry = self._loop.call_at(self._pending[0].deadline, self._expire)

    async def _write(self, batch: list[_Item]) -> None:
        started = time.perf_counter()
        lane = self._next_lane()
        conn = self._idle.pop() if self._idle else None
        try:
            # Bounded by the oldest row's deadline; the late commit may still land,
            # which only means a redelivery that dedup absorbs.
            links = [i.link for i in batch] if tracing.enabled else ()
            with tracing.span("inbox.group_commit", root=True, links=links, rows=len(batch)):
                async with asyncio.timeout_at(batch[0].deadline):
                    if conn is None or conn.is_closed():
                        conn = await self._connect()
                    if self._citus is None:
                        self._citus = (await db.citus_state(conn))[0]
                    await self._insert(conn, batch, lane)
        except Exception as exc:  # any failure: nobody in this batch may get a 200
            self._resting[lane] = time.monotonic() + LANE_REST_S
            # The connection's state is unknown (cancelled mid-query, or broken): drop it, and
            # the idle ones with it: they went to the same server, which may be gone or frozen
            # (a failover), and each would cost its batch a deadline to find out.
            if conn is not None:
                conn.terminate()
                conn = None
            idle, self._idle = self._idle, []
            for c in idle:
                c.terminate()
            reason = "timeout" if isinstance(exc, TimeoutError) else "unavailable"
            metrics.COMMIT_FAILURES.inc()
            since, n = self._failing or (time.monotonic(), 0)
            self._failing = (since, n + 1)
            held = _WARN.allow("commit", time.monotonic())
            if held is not None:
                log.warning(
                    "group commit of %d rows failed: %s%s", len(batch), type(exc).__name__, _WARN.suffix(held)
                )
            _fail(batch, Unavailable(reason))
        else:
            self.batches_written += 1
            self._resting.pop(lane, None)
            if self._failing is not None:
                since, n = self._failing
                self._failing = None
                took = time.monotonic() - since
                log.info("group commit: writing again after %d failed batches in %.1f s", n, took)
            for item in batch:
                if not item.future.done():
                    item.future.set_result(None)
            self._account(batch, started)
            if self._citus and conn is not None:
                await self._wake(conn)
        finally:
            if conn is not None:
                self._idle.append(conn)
            self._inflight -= 1
            # Rows that waited for this batch go now if their window passed or a batch is full.
            # If nothing else is being written they go at the end of their linger, counted
            # from the first one's arrival (now, if it is over): at a few hundred rows a second
            # a commit ends between two arrivals, and a row sent alone at its end would make
            # every other batch a single row. Otherwise their window's timer sends them.
            if self._pending and not self._closed:
                if self._overdue or len(self._pending) >= self._max_batch:
                    self._flush()
                elif not self._inflight:
                    self._release()

    def _account(self, batch: list[_Item], started: float) -> None:
        """Metrics of a committed batch: per batch, not per request (an observation takes a
        lock, and writes a shared file under ``serve --workers``). A row's ack latency runs from
        its staging to the commit's confirmation."""
        metrics.COMMIT_BATCH_SIZE.observe(len(batch))
        metrics.COMMIT_SECONDS.observe(time.perf_counter() - started)
        # A row's deadline is its staging time + the ack deadline: its age is base - deadline.
        base = self._loop.time() + self._deadline
        source = batch[0].source
        if all(i.source == source for i in batch):
            groups = [(source, batch)]
        else:
            groups = [(src, [i for i in batch if i.source == src]) for src in {i.source for i in batch}]
        for src, rows in groups:
            ack, stored = _metrics(src)
            metrics.observe_many(ack, [base - i.deadline for i in rows])
            stored.inc(len(rows))

    @staticmethod
    async def _wake(conn: asyncpg.Connection) -> None:
        """On Citus, where no trigger wakes the consumers: after the commit (the rows are
        answered already), in a statement of its own (inside the batch's transaction it would
        make the coordinator a second participant, and every batch a two-phase commit). One
        lost costs the consumers a poll."""
        try:
            await inbox.notify(conn)
        except Exception as exc:  # a wake-up is best effort
            log.debug("wake-up after a batch failed: %s", exc)

    @staticmethod
    async def _insert(conn: asyncpg.Connection, batch: list[_Item], lane: int) -> None:
        """One statement; a day without its partition (the maintenance job has not run) gets
        one on the spot and the statement runs again: ingest never waits for the job. A commit
        Citus put in doubt fails the batch (``store.doubt``), as a connection lost during
        COMMIT does."""
        sources = [i.source for i in batch]
        bodies = [i.body for i in batch]
        ids = [i.delivery_id for i in batch]
        with doubt.watch(conn) as commit:
            try:
                await inbox.insert_batch(conn, sources=sources, bodies=bodies, delivery_ids=ids, lane=lane)
            except asyncpg.CheckViolationError as exc:
                table = missing_partition(exc)
                if table is None:
                    raise
                made = await retention.ensure_today(conn, table=table)
                how = "made it" if made else "it exists now"
                log.warning("%s had no partition for today: %s", table, how)
                await inbox.insert_batch(conn, sources=sources, bodies=bodies, delivery_ids=ids, lane=lane)
        commit.check()

    async def close(self) -> None:
        """Stop taking rows, write what is pending, and wait for every batch."""
        self._closed = True
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        self._flush(force=True)
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        idle, self._idle = self._idle, []
        await asyncio.gather(*(c.close(timeout=2) for c in idle), return_exceptions=True)


# Label lookups resolved once per source (``labels()`` takes a lock).
_SOURCE_METRICS: dict[str, tuple[Any, Any]] = {}


def _metrics(source: str) -> tuple[Any, Any]:
    """The ack-latency histogram and the stored counter of ``source``."""
    found = _SOURCE_METRICS.get(source)
    if found is None:
        found = _SOURCE_METRICS[source] = (
            metrics.ACK_LATENCY.labels(source),
            metrics.WEBHOOK_REQUESTS.labels(source, "stored"),
        )
    return found


def _fail(items: list[_Item], exc: Unavailable) -> None:
    for item in items:
        if not item.future.done():
            item.future.set_exception(exc)
