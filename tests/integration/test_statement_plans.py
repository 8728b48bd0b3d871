"""The big statements' plans as they run: each set a statement works on (a batch's events, the
deliveries a forwarder holds or finished) is read a bounded number of times, never once per
member of another set. Asserted on the plans (auto_explain, sent to the session as notices),
not on a time: a plan that joins two sets of n row by row reads n² rows at any speed."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import asyncpg
import pytest

from gateway.core.planning import StagedRow, plan_batch
from gateway.core.settings import Settings
from gateway.inbound.consumer import Consumer
from gateway.maintenance.gauges import GAUGE_CAP
from gateway.store import console, deliveries, inbox, outbox
from gateway.store.db import STATEMENT_CACHE_MAX_CHARS, init_connection
from gateway.testing.payloads import message_obj, messages_payload, status_obj, statuses_payload, to_bytes
from tests.support.consume import stage
from tests.support.forward import add, queue_rebuilt

# Every statement's plan as run, nested ones included.
AUTO_EXPLAIN = (
    "LOAD 'auto_explain'",
    "SET auto_explain.log_min_duration = 0",
    "SET auto_explain.log_analyze = on",
    "SET auto_explain.log_nested_statements = on",
    "SET auto_explain.log_format = json",
    "SET auto_explain.log_level = notice",
)
SCANS = ("Seq Scan", "Index Scan", "Index Only Scan", "Bitmap Heap Scan", "Function Scan", "CTE Scan")


def _nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", ()):
        yield from _nodes(child)


def rows_read(plan: dict[str, Any]) -> int:
    """Rows the plan's scans read: returned plus filtered out, over all their loops."""
    return round(
        sum(
            (n.get("Actual Rows", 0) + n.get("Rows Removed by Filter", 0)) * n.get("Actual Loops", 1)
            for n in _nodes(plan["Plan"])
            if n["Node Type"] in SCANS
        )
    )


def _listener(read: dict[str, int]) -> Callable[[object, asyncpg.PostgresLogMessage], None]:
    """A notice listener keeping, per statement (the first 60 characters of its text), the
    most rows one run of it read."""

    def notice(_conn: object, msg: asyncpg.PostgresLogMessage) -> None:
        text = msg.message
        if text.startswith("duration:") and "{" in text:
            plan = json.loads(text[text.index("{") :])
            query = " ".join(plan["Query Text"].split())[:60]
            read[query] = max(read.get(query, 0), rows_read(plan))

    return notice


@contextlib.asynccontextmanager
async def explained(conn: asyncpg.Connection) -> AsyncIterator[dict[str, int]]:
    """Rows read per statement run on ``conn`` meanwhile."""
    read: dict[str, int] = {}
    notice = _listener(read)
    for setting in AUTO_EXPLAIN:
        await conn.execute(setting)
    conn.add_log_listener(notice)
    try:
        yield read
    finally:
        conn.remove_log_listener(notice)
        await conn.execute("RESET ALL")


async def test_a_forwarder_round_reads_each_set_of_deliveries_a_bounded_number_of_times(
    pool: asyncpg.Pool,
) -> None:
    # 600 held, 300 of them finished, 300 claimed. The lease's statement once joined the held
    # deliveries to the lease's array, and a generic plan (10 rows guessed per array) unnested
    # the array again for every held delivery: 270 x 576 rows, 25 ms a round.
    dest = await add(pool, "crm", "http://127.0.0.1:9/x", max_in_flight=1000)
    await queue_rebuilt(pool, dest, "P", 900)
    held: set[deliveries.Ref] = set()
    async with pool.acquire() as conn, explained(conn) as read:
        for limit in (600, 300):
            done = sorted(held)[:300]
            held.difference_update(done)
            results = [deliveries.Result(d, i, "delivered", None, 200, None) for d, i in done]
            read.clear()
            claimed, _, _ = await deliveries.cycle(
                conn, forwarder="big", held=held, results=results, breakers=[], threshold=5,
                limit=limit, lease_s=60, cooldown_s=30, housekeeping=True,
            )  # fmt: skip
            held.update(c.ref for c in claimed)
    assert len(held) == 600 and len(done) == 300
    assert any(q.startswith("INSERT INTO delivery_leases") for q in read), read
    # Each of the round's statements reads its sets (1 200 deliveries at most) a few times.
    assert max(read.values()) <= 10 * 1200, read


@pytest.mark.parametrize("steps", [False, True], ids=["statement", "citus-steps"])
async def test_a_batch_with_two_destinations_reads_its_events_a_bounded_number_of_times(
    pool: asyncpg.Pool, steps: bool
) -> None:
    # 400 events (messages and statuses) wanted by a standard and a Meta-format destination,
    # applied as one statement or as the Citus form's steps (here on one node). The delivery
    # inserts once tested each event against the (event, destination) pairs CTE to CTE: the
    # plan scanned the 800 pairs once per event (~0.3 s of a 1 000-event batch's 0.4 s).
    await add(pool, "std", "http://127.0.0.1:9/x")
    await deliveries.add_destination(
        pool, name="bot", url="http://127.0.0.1:9/y", events=["message", "status"], secret="meta-app-secret",
        max_in_flight=16, ordered=True, format="meta",
    )  # fmt: skip
    rows = []
    for i in range(200):
        for body in (
            to_bytes(messages_payload(message_obj(f"wamid.PM{i}", sender=f"4915100000{i % 7:03d}"))),
            to_bytes(statuses_payload(status_obj(f"wamid.PS{i}", "delivered"))),
        ):
            rows.append(StagedRow(await stage(pool, body), "meta", body, None))
    plan = plan_batch(rows, bodies=True)
    async with pool.acquire() as conn, explained(conn) as read:
        if not steps:  # as the consumers run it (gateway.inbound.applier); Citus plans per batch
            await conn.execute("SET plan_cache_mode = force_generic_plan")
        applied = await inbox.apply_plan(conn, plan, citus=steps)
    assert applied.fresh == 400 and applied.deliveries == 800
    # the batch statement, or the steps' insert of the deliveries
    assert any(q.startswith(("-- handle_once", "INSERT INTO delivery_queue")) for q in read), read
    # Its events (400), the keys, rows and deliveries they make, each read a few times.
    assert max(read.values()) <= 20 * 800, read


async def test_a_burst_after_a_small_analyze_is_still_read_and_applied_by_index(
    db_dsn: str, settings: Settings
) -> None:
    # The consumers' statements keep their plans on their connections. Planned while today's
    # partitions were small (a new day's first minutes, a quiet spell), a plan may scan them
    # whole where it looks a row up, and keeps doing so as they grow until the next ANALYZE:
    # each message's dedup check read the whole day of inbound_messages, a 30 000-webhook
    # burst drained at 664/s instead of 9 600/s. Here: 300 webhooks, then 3 000 read and
    # applied by the same connection; no statement reads more than a few rows per row of its
    # batch.
    read: dict[str, int] = {}
    notice = _listener(read)

    async def setup(conn: asyncpg.Connection) -> None:
        # On every acquire: a pool resets its connections (RESET ALL, listeners) on release.
        for setting in AUTO_EXPLAIN:
            await conn.execute(setting)
        conn.add_log_listener(notice)

    pool = await asyncpg.create_pool(
        db_dsn, min_size=1, max_size=1, init=init_connection, setup=setup,
        # as the gateway's pools keep it (gateway.store.db): the batch statement's plan cached
        max_cacheable_statement_size=STATEMENT_CACHE_MAX_CHARS,
    )  # fmt: skip
    try:
        # 300 webhooks staged and analyzed (today's inbound_messages still empty), applied,
        # then the burst
        for first, n in ((0, 300), (300, 3000)):
            bodies = [to_bytes(messages_payload(message_obj(f"wamid.B{i}"))) for i in range(first, first + n)]
            await inbox.insert_batch(pool, sources=["meta"] * n, bodies=bodies, delivery_ids=[None] * n)
            if not first:
                await pool.execute("ANALYZE")
            read.clear()
            consumer = Consumer(pool, settings)
            while await consumer.process_batch():
                pass
        assert await pool.fetchval("SELECT count(*) FROM inbound_messages") == 3300
    finally:
        await pool.close()
    assert any(q.startswith("-- handle_once") for q in read), read
    assert max(read.values()) <= 20 * settings.consumer_batch, read


@pytest.mark.parametrize("steps", [False, True], ids=["statement", "citus-steps"])
async def test_a_batch_of_webhooks_moved_aside_reads_them_a_bounded_number_of_times(
    pool: asyncpg.Pool, steps: bool
) -> None:
    # 1 000 webhooks that are no payload, moved aside dead with their reasons. Each one's reason
    # was once looked up by scanning the batch's (id, reason) arrays: 1 000 x 500 rows read.
    rows = []
    for i in range(1000):
        body = b"not json %d" % i if i % 2 else b'{"object": "instagram", "n": %d}' % i
        rows.append(StagedRow(await stage(pool, body), "meta", body, None))
    plan = plan_batch(rows, bodies=True)
    assert len(plan.parked) == 1000
    async with pool.acquire() as conn, explained(conn) as read:
        if not steps:
            await conn.execute("SET plan_cache_mode = force_generic_plan")
        applied = await inbox.apply_plan(conn, plan, citus=steps)
    assert applied.parked == 1000
    reasons = await pool.fetch("SELECT last_error FROM inbox_parked ORDER BY inbox_id")
    assert [r[0].split(":")[0] for r in reasons[:2]] == ["UnknownShape", "NotJson"]
    assert max(read.values()) <= 20 * 1000, read


async def _overview_pending(conn: asyncpg.Connection) -> Any:
    return (await console.overview(conn))["inbox_pending"]


# What counts or dates the webhooks not processed yet, each in any session (no planner setting).
UNPROCESSED_READS: dict[str, Callable[[asyncpg.Connection], Awaitable[Any]]] = {
    "the depth gauge": lambda conn: inbox.depth(conn, cap=GAUGE_CAP),
    "the console's overview": _overview_pending,
    "a release's newest unprocessed webhook": outbox.unprocessed_latest,
}


@pytest.mark.parametrize("name", list(UNPROCESSED_READS))
async def test_what_counts_the_unprocessed_webhooks_reads_the_rows_past_the_cursors_not_the_day(
    pool: asyncpg.Pool, settings: Settings, name: str
) -> None:
    # inbox_unread()'s lower bound is a sub-select: planned with a guess of a third of the
    # table, a count or a max over it read today's whole partition (the gauge on every refresh,
    # the console on every overview). Each plans by index whatever the caller's session: it
    # reads the few rows no cursor has passed.
    n = 3000
    bodies = [to_bytes(messages_payload(message_obj(f"wamid.G{i}"))) for i in range(n)]
    await inbox.insert_batch(pool, sources=["meta"] * n, bodies=bodies, delivery_ids=[None] * n)
    consumer = Consumer(pool, settings)
    while await consumer.process_batch():
        pass
    late = [to_bytes(messages_payload(message_obj(f"wamid.GL{i}"))) for i in range(5)]
    await inbox.insert_batch(pool, sources=["meta"] * 5, bodies=late, delivery_ids=[None] * 5)
    await pool.execute("ANALYZE webhook_inbox")
    async with pool.acquire() as conn, explained(conn) as read:
        found = await UNPROCESSED_READS[name](conn)
    newest = await pool.fetchval("SELECT max(received_at) FROM webhook_inbox")  # a late row's
    assert found == (newest if name == "a release's newest unprocessed webhook" else 5)
    # The lanes (32) a few times and the 5 rows; the overview also counts the last minute's
    # rows, here all of them (n + 5).
    budget = 300 + (n + 5 if name == "the console's overview" else 0)
    assert max(read.values()) <= budget, read
