"""Cost growth: ingest and consumer throughput as the dedup table grows, partitioned by event
day (migration 0007) side by side with the same data in one unpartitioned table; retention of
one day of keys by DROP PARTITION versus DELETE; bytes per million keys.

    python -m loadtest bench-growth [--sizes 0,10000000,50000000] [--day-keys 5000000]
                                    [--events 20000] [--concurrency 2]

Keys are generated server-side (generate_series, md5 wamids: random B-tree inserts) and
spread over the 8 days before today, as 7 days of Meta's retry window plus a day of slack
leave them. For each layout the sizes are filled in ascending order in one database; at
each size the same workload (Meta statuses and messages stamped now, 10 % redelivered) is
staged and drained by the real consumers. Targets (partitioned layout): consumer throughput
at the largest size >= 0.8x the empty table; dropping one day <= 1 s. Exits 1 on a miss.

Embedded PostgreSQL in a temporary directory, or DATABASE_URL (a scratch database is created
and dropped). Sizes are parameters: the machine this runs on decides what is practical.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import re
import time
from datetime import UTC, datetime, timedelta

import asyncpg

from gateway.core.settings import Settings
from gateway.store import inbox
from gateway.store import retention as partitions
from gateway.store.db import connect, create_pool, migrate
from gateway.testing import payloads
from gateway.testing.scratch import scratch_database
from loadtest.harness import consumers, contract, database
from loadtest.harness import report as report_
from loadtest.harness.sql import queries

SQL = queries("growth.sql")
FILL_CHUNK = 1_000_000
INGEST_BATCH = 256  # rows per INSERT, as the group commit writes them
TARGET_RATIO = 0.8
TARGET_DROP_S = 1.0
# Server settings that decide whether a big key set stays in memory: printed with the report.
PG_SETTINGS = (
    "checkpoint_timeout",
    "shared_buffers",
    "effective_cache_size",
    "work_mem",
    "maintenance_work_mem",
    "max_wal_size",
    "synchronous_commit",
    "fsync",
)


@dataclasses.dataclass
class Point:
    size: int
    ingest_rows_s: float
    consumer_events_s: float
    dedup_bytes: int
    event_bytes: int  # webhook_inbox + inbound_messages + message_statuses after the drain


@dataclasses.dataclass
class Layout:
    name: str
    points: list[Point] = dataclasses.field(default_factory=list)
    retention_s: float = 0.0
    retention_how: str = ""


def workload(events: int, tag: str, rng: random.Random) -> list[bytes]:
    """Staged bodies, one event each: statuses and messages of today, 10 % redelivered."""
    now = str(int(time.time()))
    unique = int(events / 1.1)
    bodies: list[bytes] = []
    for i in range(unique):
        if i % 4:
            st = payloads.status_obj(f"wamid.{tag}.{i}", ("sent", "delivered", "read")[i % 3], timestamp=now)
            value = payloads.meta_value(statuses=[st])
        else:
            msg = payloads.message_obj(f"wamid.{tag}.in{i}", f"Bestellung {i}", timestamp=now)
            value = payloads.meta_value(messages=[msg])
        bodies.append(payloads.meta_bytes(payloads.meta_envelope([("waba-1", [("messages", value)])])))
    bodies += rng.sample(bodies, events - unique)
    rng.shuffle(bodies)
    return bodies


async def fill(conn: asyncpg.Connection, start: int, stop: int) -> None:
    # Room to sort a chunk in memory (the fill's ORDER BY; the measurements use the default).
    await conn.execute("SET work_mem = '256MB'")
    for lo in range(start, stop, FILL_CHUNK):
        hi = min(stop, lo + FILL_CHUNK)
        t = time.perf_counter()
        await conn.execute(SQL["growth_fill"], lo, hi)
        print(f"    filled {hi:>11,} keys ({time.perf_counter() - t:5.1f} s for this chunk)", flush=True)
    await conn.execute("RESET work_mem")
    await conn.execute("VACUUM ANALYZE processed_webhook_events")
    await conn.execute("CHECKPOINT")


async def measure(pool: asyncpg.Pool, settings: Settings, bodies: list[bytes]) -> tuple[float, float]:
    """(ingest rows/s, consumer events/s) for one staged backlog."""
    async with pool.acquire() as conn:
        await conn.execute(SQL["growth_reset_inbox"])
        started = time.perf_counter()
        for i in range(0, len(bodies), INGEST_BATCH):
            chunk = bodies[i : i + INGEST_BATCH]
            await inbox.insert_batch(
                conn, sources=["meta"] * len(chunk), bodies=chunk, delivery_ids=[None] * len(chunk)
            )
        ingest = len(bodies) / (time.perf_counter() - started)
        await conn.execute("VACUUM ANALYZE webhook_inbox")

    started = time.perf_counter()
    await consumers.drain(pool, settings)
    consumed = len(bodies) / (time.perf_counter() - started)
    left = await pool.fetchval(SQL["growth_not_done"])
    if left:
        raise SystemExit(f"{left} staged rows not processed")
    return ingest, consumed


async def retention(conn: asyncpg.Connection, layout: str, day_keys: int, base: int) -> tuple[float, str]:
    day = datetime.now(UTC).date() - timedelta(days=12)  # older than every other partition
    if layout == "partitioned":
        await partitions.ensure_day(conn, table="processed_webhook_events", day=day)
    t = time.perf_counter()
    await conn.execute(SQL["growth_fill_day"], day, base, day_keys)
    print(f"    filled one day of {day_keys:,} keys ({time.perf_counter() - t:.1f} s)", flush=True)
    await conn.execute("VACUUM ANALYZE processed_webhook_events")
    await conn.execute("CHECKPOINT")
    started = time.perf_counter()
    if layout == "partitioned":
        dropped = await partitions.drop_oldest(
            conn, table="processed_webhook_events", before=day + timedelta(1), keep_days=8
        )
        assert dropped == f"processed_webhook_events_p{day:%Y%m%d}", dropped
        how = "DETACH + DROP of the day's partition (its recent keys kept in the default one)"
    else:
        await conn.execute(SQL["growth_delete_day"], day)
        how = "one DELETE of the day's rows (before VACUUM)"
    return time.perf_counter() - started, how


async def run_layout(dsn: str, name: str, ns: argparse.Namespace, sizes: list[int]) -> Layout:
    settings = dataclasses.replace(
        Settings(), database_url=dsn, consumer_concurrency=ns.concurrency, consumer_batch=ns.batch
    )
    conn = await connect(dsn)
    await migrate(conn)
    shown = [f"{k}={await conn.fetchval(f'SHOW {k}')}" for k in PG_SETTINGS]
    print(f"  {name}: PostgreSQL {await conn.fetchval('SHOW server_version')}: {' '.join(shown)}", flush=True)
    if name == "unpartitioned":
        await conn.execute(SQL["growth_unpartition"])
    layout = Layout(name)
    rng = random.Random(ns.seed)
    pool = await create_pool(dsn, 1, ns.concurrency + 2)
    try:
        # An unmeasured pass first: the first drain of a fresh database pays for connections,
        # catalog caches and plans, and would flatter every later size.
        await measure(pool, settings, workload(max(1000, ns.events // 4), "warmup", rng))
        filled = 0
        for size in sizes:
            print(f"  {name}: {size:,} existing keys", flush=True)
            await fill(conn, filled, size)
            filled = size
            ingest, consumed = await measure(pool, settings, workload(ns.events, f"s{size}", rng))
            size_bytes = await conn.fetchval(SQL["growth_bytes"], "processed_webhook_events")
            event_bytes = 0
            for table in ("webhook_inbox", "inbound_messages", "message_statuses"):
                event_bytes += await conn.fetchval(SQL["growth_bytes"], table)
            layout.points.append(Point(size, ingest, consumed, size_bytes, event_bytes))
            print(f"    ingest {ingest:9,.0f} rows/s   consumers {consumed:8,.0f} events/s", flush=True)
        layout.retention_s, layout.retention_how = await retention(conn, name, ns.day_keys, 10 * filled + 1)
        print(f"    retention: {layout.retention_how}: {layout.retention_s:.3f} s", flush=True)
    finally:
        await pool.close()
        await conn.close()
    return layout


def report(layouts: list[Layout], ns: argparse.Namespace, run: contract.Run) -> str:
    part = next(la for la in layouts if la.name == "partitioned")
    lines = [f"bench-growth: {ns.events} events per point, {ns.concurrency} consumers, batch {ns.batch}"]
    lines.append(
        f"{'existing keys':>14} | "
        + " | ".join(f"{la.name + ' ingest/s':>22} {'consume/s':>10}" for la in layouts)
    )
    for i, size in enumerate(p.size for p in part.points):
        cells = [
            f"{la.points[i].ingest_rows_s:>22,.0f} {la.points[i].consumer_events_s:>10,.0f}" for la in layouts
        ]
        lines.append(f"{size:>14,} | " + " | ".join(cells))
    for la in layouts:
        first, last = la.points[0], la.points[-1]
        ratio = last.consumer_events_s / first.consumer_events_s
        per_m = [p.dedup_bytes / p.size * 1e6 / 2**20 for p in la.points if p.size]
        size_note = f", {per_m[-1]:.0f} MiB per million keys (table + indexes)" if per_m else ""
        size_note += (
            f", staging + feed + statuses {last.event_bytes / ns.events * 1e6 / 2**20:.0f} MiB"
            " per million events"
        )
        lines.append(
            f"{la.name}: consumers at {last.size:,} keys = {ratio:.2f}x the empty table{size_note}; "
            f"retention of one day ({ns.day_keys:,} keys): {la.retention_how} {la.retention_s:.3f} s"
        )
    ratio = part.points[-1].consumer_events_s / part.points[0].consumer_events_s
    run.target(
        report_.Target(
            f"partitioned: consumers at {part.points[-1].size:,} keys / the empty table",
            ratio,
            TARGET_RATIO,
            ">=",
            "x",
        )
    )
    run.target(report_.Target(f"partitioned: retention of one day of {ns.day_keys:,} keys", part.retention_s,
                              TARGET_DROP_S, "<=", " s"))  # fmt: skip
    return "\n".join(lines)


HELP = "throughput as the dedup table grows; DROP vs DELETE retention"


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sizes", default="0,10000000,50000000", help="existing dedup keys, comma-separated")
    p.add_argument("--day-keys", type=int, default=5_000_000, help="keys in the day that retention removes")
    p.add_argument("--events", type=int, default=20000, help="staged events per measurement")
    p.add_argument("--concurrency", type=int, default=2, help="consumer loops")
    p.add_argument("--batch", type=int, default=Settings().consumer_batch, help="rows per consumer batch")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--max-wal-size",
        default="8GB",
        help="max_wal_size of the embedded server the bench starts ('' keeps the default; "
        "never changed on a DATABASE_URL server)",
    )


async def main(ns: argparse.Namespace) -> int:
    run = contract.Run(ns)
    if ns.max_wal_size and not re.fullmatch(r"[0-9]+(MB|GB)", ns.max_wal_size):
        raise SystemExit(f"--max-wal-size: a size like 8GB or 512MB, not {ns.max_wal_size!r}")
    sizes = sorted({int(s) for s in ns.sizes.split(",")} | {0})
    layouts = []
    with database.server("bench-growth") as (admin_dsn, embedded):
        if embedded and ns.max_wal_size:
            await database.configure(admin_dsn, {**database.BULK_FILL, "max_wal_size": ns.max_wal_size})
        for name in ("partitioned", "unpartitioned"):
            async with scratch_database(admin_dsn, f"bench_growth_{name}") as dsn:
                layouts.append(await run_layout(dsn, name, ns, sizes))
    text = report(layouts, ns, run)
    return run.finish({"layouts": [dataclasses.asdict(la) for la in layouts]}, text)
