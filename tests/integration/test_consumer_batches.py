"""The consumer's batches and its loop against a real PostgreSQL: what one claim takes, how
many statements a batch costs, when the loop claims again, and how a group's consumers are
woken (one idle consumer per NOTIFY, more for a backlog)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import asyncpg
import pytest
from asyncpg.exceptions import InternalClientError

from gateway.core.lanes import LaneSet
from gateway.core.settings import Settings
from gateway.inbound import consumer as consumer_module
from gateway.inbound import consumer_group
from gateway.inbound.consumer import Consumer
from gateway.inbound.consumer_group import ConsumerGroup
from gateway.inbound.lanes import LaneLease
from gateway.runtime import services
from gateway.store import inbox
from gateway.store import listen as store_listen
from gateway.store.db import connect, create_pool, init_connection
from gateway.testing.payloads import (
    message_obj,
    messages_payload,
    meta_payload,
    meta_value,
    status_obj,
    to_bytes,
)
from tests.support.config import replace
from tests.support.consume import inbox_states, leased, stage, stage_on
from tests.support.forward import until


async def test_batch_reads_bodies_up_to_a_byte_budget(pool: asyncpg.Pool, settings: Settings) -> None:
    bodies = [to_bytes(messages_payload(message_obj(f"wamid.B{i}", text="x" * 800))) for i in range(5)]
    for b in bodies:
        await stage(pool, b)
    size = len(bodies[0])
    consumer = Consumer(pool, replace(settings, consumer_batch=100, consumer_batch_bytes=2 * size + 10))
    assert [await consumer.process_batch() for _ in range(4)] == [2, 2, 1, 0]
    # A single row larger than the budget is still processed, alone.
    await stage(pool, to_bytes(messages_payload(message_obj("wamid.BIG", text="y" * 5000))))
    assert await consumer.process_batch() == 1
    assert await pool.fetchval("SELECT count(*) FROM inbound_messages") == 6


@pytest.mark.parametrize(
    ("limit", "budget_rows", "claimed", "more"),
    [
        (10, 10, 5, False),  # everything unread fits: wait for the next wake-up
        (5, 10, 5, True),  # a full batch: more may be unread
        (10, 2, 2, True),  # the byte budget cut the rows the limit let through
    ],
)
async def test_a_read_says_whether_more_rows_are_due(
    pool: asyncpg.Pool, settings: Settings, limit: int, budget_rows: int, claimed: int, more: bool
) -> None:
    bodies = [to_bytes(messages_payload(message_obj(f"wamid.M{i}", text="x" * 800))) for i in range(5)]
    for b in bodies:
        await stage(pool, b)
    lanes = LaneSet()
    await LaneLease(settings, lanes).refresh(pool)
    batch = await inbox.read(pool, lanes.take(), limit=limit, max_bytes=budget_rows * len(bodies[0]) + 10)
    assert (len(batch.rows), not batch.exhausted) == (claimed, more)


async def test_a_batch_costs_a_constant_number_of_statements(db_dsn: str, settings: Settings) -> None:

    pool = await create_pool(db_dsn, 1, 1)
    try:
        statements: list[str] = []
        async with pool.acquire() as conn:
            conn.add_query_logger(lambda rec: statements.append(rec.query))
        consumer = await leased(pool, replace(settings, consumer_batch=1000))
        # The first batch also runs asyncpg's one-off type introspection: a warm-up.
        for warm_up, n_rows in ((True, 1), (False, 1), (False, 300)):
            for i in range(n_rows):
                sts = [status_obj(f"wamid.{n_rows}.{i}", s) for s in ("sent", "delivered", "read")]
                await pool.execute(
                    "INSERT INTO webhook_inbox (source, body) VALUES ('meta', $1)",
                    to_bytes(
                        meta_payload(
                            (
                                "messages",
                                meta_value(messages=[message_obj(f"wamid.m{n_rows}.{i}")], statuses=sts),
                            )
                        )
                    ),
                )
            statements.clear()
            assert await consumer.process_batch() == n_rows
            # BEGIN, the read's settings, read, SAVEPOINT, apply_batch, COMMIT (which releases
            # the savepoint) and the pool's reset on release: the same seven for 4 events and
            # for 1200.
            if not warm_up:
                assert len(statements) == 7, [s[:60] for s in statements]
    finally:
        await pool.close()


async def _kept_loop(
    db_dsn: str,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
    poll_ms: int = 60_000,
    reset: Callable[[asyncpg.Connection], Any] | None = None,
) -> tuple[asyncpg.Pool, asyncpg.Connection, Consumer, list[str]]:
    """A loop of a group (a leased consumer, keeping its connection as in ``run``, no look at
    dead items in its busy steps) on a pool of one connection whose statements are logged
    (``reset``: the pool's, instead of asyncpg's); rows are staged and counted on a connection
    of their own."""
    if reset is None:
        pool = await create_pool(db_dsn, 1, 1)
    else:
        pool = await asyncpg.create_pool(db_dsn, min_size=1, max_size=1, init=init_connection, reset=reset)
    other = await connect(db_dsn)
    statements: list[str] = []
    async with pool.acquire() as conn:
        conn.add_query_logger(lambda rec: statements.append(rec.query))
    monkeypatch.setattr(consumer_module, "ITEMS_EVERY_S", 3600.0)  # dead items: when idle only
    consumer = await leased(pool, replace(settings, consumer_poll_ms=poll_ms))
    consumer._keep = True
    consumer._items_at = time.monotonic()
    return pool, other, consumer, statements


async def _stage_on(other: asyncpg.Connection, wamid: str) -> None:
    await stage_on(other, to_bytes(messages_payload(message_obj(wamid))))


async def test_a_busy_loop_keeps_its_connection_from_batch_to_batch(
    db_dsn: str, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A group's loop keeps its connection from one batch to the next, with the read's mode set
    once for the session: a batch is five statements (BEGIN, read, SAVEPOINT and the apply's
    settings, apply, COMMIT), not seven (no read mode, no pool reset). Given back, the
    connection is reset: its next user gets the server's settings."""
    pool, other, consumer, statements = await _kept_loop(db_dsn, settings, monkeypatch)
    try:
        await _stage_on(other, "wamid.K1")
        assert await consumer.step() == 1  # the first batch also warms up
        await asyncio.sleep(0.01)  # the query logger is called soon after each statement
        first = [q for q in statements if "set_config('enable_sort'" in q]
        assert first and "false" in first[0]  # the session's, once
        statements.clear()
        await _stage_on(other, "wamid.K2")
        assert await consumer.step() == 1
        await asyncio.sleep(0.01)
        assert len(statements) == 5, [q[:60] for q in statements]
        assert statements[0].startswith("BEGIN") and statements[-1].startswith("COMMIT")
        assert not [q for q in statements if "RESET ALL" in q or "set_config('enable_sort'" in q]
        await consumer._let_go()
        async with pool.acquire() as conn:
            shown = [await conn.fetchval(f"SHOW {g}") for g in ("enable_sort", "enable_seqscan")]
            assert shown == ["on", "on"]
            assert await conn.fetchval("SHOW idle_in_transaction_session_timeout") == "0"
    finally:
        await other.close()
        await pool.close()


async def test_a_loop_whose_kept_connection_died_reads_again_on_a_new_one(
    db_dsn: str, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server ends the kept connection's session between two batches (a restart, a
    failover, an operator's pg_terminate_backend): the next batch fails before it writes
    anything and gives the connection up; the one after reads the row on a new connection, once."""
    pool, other, consumer, _ = await _kept_loop(db_dsn, settings, monkeypatch)
    try:
        await _stage_on(other, "wamid.D1")
        assert await consumer.step() == 1
        killed = await other.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            " AND backend_type = 'client backend'"
        )
        assert killed == 1  # the pool's only connection, kept by the loop
        await _stage_on(other, "wamid.D2")
        # Which error depends on when the client reads the server's goodbye.
        with pytest.raises((asyncpg.PostgresError, asyncpg.InterfaceError, InternalClientError, OSError)):
            await consumer.step()
        assert consumer._kept is None
        assert await consumer.step() == 1
        assert await other.fetchval("SELECT count(*) FROM inbound_messages") == 2
        assert await other.fetchval("SELECT count(*) FROM processed_webhook_events") == 2
        assert await other.fetchval("SELECT count(*) FROM inbox_row_states() WHERE state <> 'done'") == 0
        await consumer._let_go()
    finally:
        await other.close()
        await pool.close()


async def test_a_quiet_loop_gives_its_connection_back(
    db_dsn: str, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A loop that no wake-up reached for a poll interval gives the kept connection back: an
    idle gateway does not hold a connection per loop."""
    pool, other, consumer, _ = await _kept_loop(db_dsn, settings, monkeypatch, poll_ms=300)
    stop = asyncio.Event()
    task = asyncio.create_task(consumer.run(stop))
    try:
        await _stage_on(other, "wamid.Q1")
        consumer.wake()  # as a NOTIFY does

        async def processed() -> bool:
            return bool(await other.fetchval("SELECT count(*) = 1 FROM processed_webhook_events"))

        await until(processed, what="the row")
        async with asyncio.timeout(5):  # the pool's only connection comes back to it
            async with pool.acquire() as conn:
                assert await conn.fetchval("SHOW enable_sort") == "on"
    finally:
        stop.set()
        consumer.wake()
        await task
        await other.close()
        await pool.close()


async def test_a_kept_connection_whose_reset_fails_is_dropped_and_its_loop_goes_on(
    db_dsn: str, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kept connection whose reset fails as it is given back (its server gone, as in a
    failover) is dropped by the pool without failing the loop, which gives it back outside a
    step's error handling too (after a quiet poll interval); the next row is processed on a
    new connection."""
    failures: list[Exception] = []

    async def reset(conn: asyncpg.Connection) -> None:
        if failures:
            raise failures.pop()

    pool, other, consumer, _ = await _kept_loop(db_dsn, settings, monkeypatch, reset=reset)
    try:
        await _stage_on(other, "wamid.R1")
        assert await consumer.step() == 1
        assert consumer._kept is not None
        before = await consumer._kept.fetchval("SELECT pg_backend_pid()")
        failures.append(ConnectionResetError("the server closed the connection during the reset"))
        await consumer._let_go()  # as the idle loop does: it must not raise
        assert not failures and consumer._kept is None
        await _stage_on(other, "wamid.R2")
        assert await consumer.step() == 1
        assert consumer._kept is not None
        assert await consumer._kept.fetchval("SELECT pg_backend_pid()") != before  # the other was dropped
        assert await other.fetchval("SELECT count(*) FROM processed_webhook_events") == 2
    finally:
        await consumer._let_go()
        await other.close()
        await pool.close()


async def test_a_loop_whose_siblings_hold_every_lane_sends_no_statement(
    db_dsn: str, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A loop woken while its sibling is in a batch over every lane reads nothing: it opens no
    transaction and does not look at dead items either (its sibling is at work, not idle); the
    lanes it found out are wanted, so the sibling reads them again when it gives them back."""
    pool = await create_pool(db_dsn, 1, 1)
    try:
        statements: list[str] = []
        async with pool.acquire() as conn:
            conn.add_query_logger(lambda rec: statements.append(rec.query))
        consumer = await leased(pool, settings)
        monkeypatch.setattr(consumer_module, "ITEMS_EVERY_S", 3600.0)  # dead items: when idle only
        assert await consumer.step() == 0  # idle: it looked at dead items
        await stage(pool, to_bytes(messages_payload(message_obj("wamid.S1"))))
        lanes = consumer._lanes
        sibling = lanes.take()  # every lane of the only shard, out with a sibling loop
        assert sibling and not [lane for lane in lanes.cursors if lane not in lanes.out]
        statements.clear()
        assert await consumer.step() == 0
        assert statements == []
        assert lanes.give_back([c.lane for c in sibling], sibling)  # wanted: read again
        assert await consumer.step() == 1
        assert any("AS taken" in q for q in statements)
        assert await inbox_states(pool) == {"done": 1}
    finally:
        await pool.close()


async def test_after_a_batch_that_left_nothing_due_the_loop_waits(db_dsn: str, settings: Settings) -> None:
    # It used to claim again at once, find nothing, and look at dead items: eight round trips
    # per batch for nothing (half the batches under load). A NOTIFY during the batch, or the
    # poll, wakes it instead.

    pool = await create_pool(db_dsn, 1, 1)
    stop = asyncio.Event()

    async def done(n: int) -> bool:
        return await inbox_states(pool) == {"done": n}

    try:
        claims: list[str] = []
        async with pool.acquire() as conn:
            conn.add_query_logger(lambda rec: claims.append(rec.query) if "AS taken" in rec.query else None)
        await stage(pool, to_bytes(messages_payload(message_obj("wamid.W1"))))
        consumer = Consumer(pool, replace(settings, consumer_poll_ms=60_000))
        task = asyncio.create_task(consumer.run(stop))
        await until(lambda: done(1), what="the first row")
        await asyncio.sleep(0.3)
        assert len(claims) == 1
        await stage(pool, to_bytes(messages_payload(message_obj("wamid.W2"))))
        consumer.wake()  # as a NOTIFY does
        await until(lambda: done(2), what="the second row")
        assert len(claims) == 2
    finally:
        stop.set()
        consumer.wake()
        await task
        await pool.close()


class _Batches:
    """Each consumer's batches (rows claimed), as they happen, and the LISTEN connection's
    wake-ups (the first comes when it connects: a look that could land at any moment).

    While ``hold`` is set, a consumer that has claimed rows waits before its next claim until
    a sibling has claimed some too (once, at most ``HOLD_S``): whether a sibling takes part in
    a backlog then depends on whether it was woken, not on which task the event loop happens
    to run first (under load, one consumer used to drain all 40 rows before a woken sibling
    had claimed)."""

    HOLD_S = 10.0

    def __init__(self, group: ConsumerGroup, monkeypatch: pytest.MonkeyPatch) -> None:
        self.seen: list[list[int]] = []
        self.notified = 0
        self.hold = False
        self._helped = asyncio.Event()
        for c in group.consumers:
            batches: list[int] = []
            self.seen.append(batches)

            async def counted(orig: Any = c.process_batch, batches: list[int] = batches) -> int:
                if self.hold and any(batches) and not self._helped.is_set():
                    try:
                        await asyncio.wait_for(self._helped.wait(), self.HOLD_S)
                    except TimeoutError:
                        self.hold = False  # no sibling came: this one drains the rest
                n: int = await orig()
                batches.append(n)
                if self.busy() >= 2:
                    self._helped.set()
                return n

            c.process_batch = counted  # type: ignore[method-assign]

        async def listen(
            opener: Any,
            channel: str,
            on_notify: Callable[[], None],
            stop: asyncio.Event,
            *args: Any,
            **kw: Any,
        ) -> None:
            def counted() -> None:
                self.notified += 1
                on_notify()

            await store_listen.listen(opener, channel, counted, stop, *args, **kw)

        monkeypatch.setattr(consumer_group, "listen", listen)

    def rows(self) -> list[int]:
        return sorted(n for batches in self.seen for n in batches)

    def busy(self) -> int:
        """How many consumers claimed rows."""
        return sum(1 for batches in self.seen if any(batches))

    def forget(self) -> None:
        for batches in self.seen:
            batches.clear()

    def hold_from_now(self) -> None:
        """Forget the batches so far and hold (see the class)."""
        self.forget()
        self.hold = True

    async def all_idle(self, group: ConsumerGroup) -> None:
        """Wait until the listener is up and every consumer has had its looks and waits;
        forget those looks."""

        async def idle() -> bool:
            return self.notified > 0 and all(c.idle for c in group.consumers)

        await until(idle, what="the listener and idle consumers")
        self.forget()


async def test_a_notify_wakes_one_idle_consumer_and_a_backlog_wakes_more(
    pool: asyncpg.Pool, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    group = ConsumerGroup(
        pool, replace(settings, consumer_concurrency=3, consumer_batch=10, consumer_poll_ms=60_000)
    )
    batches = _Batches(group, monkeypatch)

    async def done(n: int) -> bool:
        return await inbox_states(pool) == {"done": n}

    async with services.running(group):
        await batches.all_idle(group)
        await stage(pool, to_bytes(messages_payload(message_obj("wamid.N1"))))  # one NOTIFY
        await until(lambda: done(1), what="the first row")
        await asyncio.sleep(0.2)
        # One consumer claimed it; the others were not woken to claim nothing.
        assert batches.rows() == [1]
        # 40 rows in one statement (one NOTIFY): each full batch wakes an idle sibling.
        batches.hold_from_now()
        bodies = [to_bytes(messages_payload(message_obj(f"wamid.N{i}"))) for i in range(2, 42)]
        await pool.execute(
            "INSERT INTO webhook_inbox (source, body) SELECT 'meta', b FROM unnest($1::bytea[]) b", bodies
        )
        await until(lambda: done(41), timeout_s=60, what="the backlog")
        assert batches.busy() >= 2, batches.seen


async def test_rows_staged_within_the_gap_after_a_batch_share_the_next_one(
    pool: asyncpg.Pool, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each ingest commit NOTIFYs: one batch per wake-up would pay a batch's fixed cost for
    # every row or two. A woken batch starts GATEWAY_CONSUMER_BATCH_GAP_MS after the last one
    # began, and no other consumer is woken for what it will claim.
    gap_s = 1.5
    group = ConsumerGroup(
        pool,
        replace(
            settings, consumer_concurrency=2, consumer_batch=10, consumer_poll_ms=60_000,
            consumer_batch_gap_ms=gap_s * 1000,
        ),
    )  # fmt: skip
    batches = _Batches(group, monkeypatch)

    async def done(n: int) -> bool:
        return await inbox_states(pool) == {"done": n}

    async with services.running(group):
        await batches.all_idle(group)
        await stage(pool, to_bytes(messages_payload(message_obj("wamid.G0"))))
        await until(lambda: done(1), what="the first row")
        first = await pool.fetchval("SELECT processed_at FROM processed_webhook_events")
        for i in range(1, 6):  # five commits, five NOTIFYs, well within the gap
            await stage(pool, to_bytes(messages_payload(message_obj(f"wamid.G{i}"))))
        await until(lambda: done(6), what="the five rows")
        later = await pool.fetch(
            "SELECT DISTINCT processed_at FROM processed_webhook_events WHERE processed_at > $1", first
        )
    assert batches.rows() == [1, 5], batches.seen  # one batch for the five, no claim of nothing
    # The five keys went in one statement (moments apart), a gap after the first (the keys'
    # times are their statements', each some way into its batch: a little slack).
    at = sorted(r["processed_at"] for r in later)
    assert len(at) == 5 and (at[-1] - at[0]).total_seconds() < 0.5, at
    assert (at[0] - first).total_seconds() >= gap_s - 0.25


async def test_a_row_committed_in_a_lane_a_sibling_holds_waits_for_its_batch_not_a_poll(
    pool: asyncpg.Pool, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Loop A has read every lane and is still in its batch when a row commits there. The row's
    NOTIFY wakes the idle loop B, which finds no lane free and reads nothing. A reads its lanes
    again once its batch is done: the row waits for that batch, not for the poll (a minute here)."""
    group = ConsumerGroup(
        pool, replace(settings, consumer_concurrency=2, consumer_poll_ms=60_000, consumer_batch_gap_ms=10)
    )
    batches = _Batches(group, monkeypatch)  # the listener's NOTIFYs counted
    held = asyncio.Event()  # a batch read the first row and waits
    release = asyncio.Event()
    empty: list[Consumer] = []  # loops whose batch read nothing after the second row committed
    second_staged = asyncio.Event()  # the second row is being staged
    for c in group.consumers:

        async def read_shards(conn: Any, take: Any, orig: Any = c._read_shards) -> Any:
            read, more = await orig(conn, take)
            if any(rows for _, rows, _ in read) and not held.is_set():
                held.set()
                await release.wait()  # the batch's transaction stays open, its lanes out
            return read, more

        async def process_batch(orig: Any = c.process_batch, c: Consumer = c) -> int:
            n: int = await orig()
            if n == 0 and second_staged.is_set():
                empty.append(c)
            return n

        c._read_shards = read_shards  # type: ignore[method-assign]
        c.process_batch = process_batch  # type: ignore[method-assign]

    async def done(n: int) -> bool:
        return await inbox_states(pool) == {"done": n}

    async with services.running(group):
        await batches.all_idle(group)
        await stage(pool, to_bytes(messages_payload(message_obj("wamid.H1"))))
        await asyncio.wait_for(held.wait(), 10)
        # Set first: the sibling's look (no lane free: no statement) may end before stage returns.
        second_staged.set()
        await stage(pool, to_bytes(messages_payload(message_obj("wamid.H2"))))  # commits after A's read
        await until(lambda: _some(empty), what="the sibling's look, which finds every lane out")
        release.set()
        await until(lambda: done(2), timeout_s=10, what="the second row, read again by the lanes' holder")


async def _some(found: list[Consumer]) -> bool:
    return bool(found)


async def test_a_group_whose_loop_ended_on_its_own_ends_with_it(
    pool: asyncpg.Pool, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A consumer loop that ends with an error (a bug) ends its group with that error, for the
    process to report as a service that stopped on its own. The group used to wait for its
    listener, which runs until the process stops: the process went on with no consumer."""
    group = ConsumerGroup(pool, replace(settings, consumer_concurrency=2))
    first = group.consumers[0]

    async def broken(stop: asyncio.Event) -> None:
        raise RuntimeError("a loop's bug")

    monkeypatch.setattr(first, "run", broken)
    stop = asyncio.Event()
    try:
        with pytest.raises(RuntimeError, match="a loop's bug"):
            async with asyncio.timeout(15):
                await group.run(stop)
    finally:
        stop.set()
