"""Sender throughput against the fake provider: sends per second to many distinct recipients.

    python -m loadtest.bench_send [--messages 10000] [--recipients 1000]
    python -m loadtest.bench_send --latency [--rate 20] [--messages 200]

``--latency``: enqueue→provider latency at a low rate (one enqueue transaction per message, as
the send API does; latency = the fake's arrival stamp minus the commit), p50/p99, for a sender
that only polls every 500 ms (the default poll, i.e. before NOTIFY: the baseline) and for one
woken by NOTIFY ``outbox``, in the same run. Target: NOTIFY p50 <= 50 ms and <= 1/5 of the
polling p50; exits 1 when missed.

Self-contained: an embedded PostgreSQL in a temp dir (or a scratch database on DATABASE_URL),
the fake provider in a subprocess (its own core), the sender in this process. Pacing is set so
it is not the limit (pair interval 0, number rate 1e6/s). The baseline, measured in the same run,
is a bare aiohttp client posting the same messages to the same fake with the same concurrency and
no database: the ratio says what the outbox costs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import asyncpg
import orjson

from gateway.core.settings import Settings
from gateway.outbound.sender import Sender
from gateway.store import outbox
from gateway.store.db import connect, create_pool, migrate
from gateway.testing.scratch import scratch_database
from loadtest.harness import contract, database, processes, report
from loadtest.harness.sql import q
from loadtest.harness.stats import percentile


async def _baseline(url: str, n: int, recipients: int, concurrency: int) -> float:
    """Bare client: the same POSTs, no database, no classification."""
    limit = asyncio.Semaphore(concurrency)
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one(i: int) -> None:
            body = orjson.dumps(
                {
                    "messaging_product": "whatsapp",
                    "to": f"49151{i % recipients:08d}",
                    "type": "text",
                    "text": {"body": f"bench {i}"},
                    "biz_opaque_callback_data": f"base:{i}",
                }
            )
            async with limit, session.post(url, data=body, headers={"Authorization": "Bearer b"}) as r:
                await r.read()
                assert r.status == 200

        started = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(n)))
        return n / (time.perf_counter() - started)


async def _received(fake_url: str) -> int:
    async with aiohttp.ClientSession() as s, s.get(f"{fake_url}/_fake/received") as r:
        return len(await r.json(content_type=None))


@contextlib.asynccontextmanager
async def _environment(dsn: str, log_dir: Path) -> AsyncIterator[tuple[asyncpg.Pool, str]]:
    """A migrated database's pool and the fake provider's URL (the provider in a subprocess)."""
    fake = processes.start_fake_provider(dsn, processes.DEFAULT_SECRETS, log_dir, webhook_url="")
    try:
        await fake.wait_ready(path=None)
        conn = await connect(dsn)
        await migrate(conn)
        await conn.close()
        pool = await create_pool(dsn, 2, 10)
        try:
            yield pool, fake.url
        finally:
            await pool.close()
    finally:
        fake.stop()


async def _run(dsn: str, args: argparse.Namespace) -> dict[str, float]:
    async with _environment(dsn, args.log_dir) as (pool, fake_url):
        settings = Settings(
            database_url=dsn,
            graph_url=f"{fake_url}/v21.0",
            graph_token="bench",
            pair_interval_s=args.pair_interval,
            number_rate_per_s=1e6,
            send_batch=args.batch,
            send_concurrency=args.concurrency,
            send_loops=args.loops,
            send_poll_ms=10,
        )
        base_rate = await _baseline(
            f"{fake_url}/v21.0/1111/messages", args.messages, args.recipients, args.concurrency
        )

        keys = [f"m{i}" for i in range(args.messages)]
        recips = [f"49152{i % args.recipients:08d}" for i in range(args.messages)]
        payload = {"type": "text", "text": {"body": "bench"}}
        await pool.execute(q("lt_outbox_enqueue_bulk"), "bench", "meta", "1111", payload, keys, recips)

        sender = Sender(pool, settings)
        stop = asyncio.Event()
        started = time.perf_counter()
        task = asyncio.create_task(sender.run(stop))
        done = 0
        while done < args.messages:
            await asyncio.sleep(0.02)
            done = await pool.fetchval(
                "SELECT count(*) FROM outbox WHERE state NOT IN ('pending', 'sending')"
            )
        elapsed = time.perf_counter() - started
        stop.set()
        await task
        await sender.close()
        accepted = await pool.fetchval("SELECT count(*) FROM outbox WHERE state = 'accepted'")
        received = await _received(fake_url) - args.messages  # minus the baseline's
        return {
            "messages": args.messages,
            "recipients": args.recipients,
            "accepted": accepted,
            "received": received,
            "seconds": elapsed,
            "sends_per_s": args.messages / elapsed,
            "baseline_per_s": base_rate,
        }


async def _arrivals(fake_url: str) -> dict[str, float]:
    async with aiohttp.ClientSession() as s, s.get(f"{fake_url}/_fake/received") as r:
        return {m["callback_data"]: m["at"] for m in await r.json(content_type=None)}


async def _latency_mode(
    pool: asyncpg.Pool, dsn: str, fake_url: str, args: argparse.Namespace, notify: bool
) -> list[float]:
    settings = Settings(
        database_url=dsn,
        graph_url=f"{fake_url}/v21.0",
        graph_token="bench",
        pair_interval_s=0.0,
        number_rate_per_s=1e6,
        send_poll_ms=500,
    )
    tenant = "notify" if notify else "poll"
    sender = Sender(pool, settings, listen=notify)  # listen=False: polls only, as before NOTIFY
    stop = asyncio.Event()
    task = asyncio.create_task(sender.run(stop))
    await asyncio.sleep(1.0)  # listening
    committed: dict[str, float] = {}
    payload = {"type": "text", "text": {"body": "latency"}}
    for i in range(args.messages):
        m = outbox.NewMessage(tenant, f"l{i}", "meta", "1111", f"49153{i:08d}", payload)
        async with pool.acquire() as conn, conn.transaction():
            await outbox.enqueue(conn, m)
        committed[f"{tenant}:l{i}"] = time.time()
        await asyncio.sleep(1 / args.rate)
    deadline = time.monotonic() + 30
    arrived: dict[str, float] = {}
    while time.monotonic() < deadline:
        arrived = await _arrivals(fake_url)
        if all(k in arrived for k in committed):
            break
        await asyncio.sleep(0.1)
    stop.set()
    await task
    await sender.close()
    missing = [k for k in committed if k not in arrived]
    if missing:
        raise RuntimeError(f"{len(missing)} messages never arrived")
    return [(arrived[k] - t) * 1000 for k, t in committed.items()]


async def _latency(dsn: str, args: argparse.Namespace) -> dict[str, float]:
    async with _environment(dsn, args.log_dir) as (pool, fake_url):
        poll = await _latency_mode(pool, dsn, fake_url, args, notify=False)
        woken = await _latency_mode(pool, dsn, fake_url, args, notify=True)
    return {
        "poll_p50": percentile(poll, 50),
        "poll_p99": percentile(poll, 99),
        "notify_p50": percentile(woken, 50),
        "notify_p99": percentile(woken, 99),
    }


def _report_latency(r: dict[str, float], args: argparse.Namespace, run: contract.Run) -> str:
    lines = [f"enqueue->provider at {args.rate:g}/s, {args.messages} messages per mode:"]
    for label, key in (
        ("polling every 500 ms (baseline, no NOTIFY)", "poll"),
        ("woken by NOTIFY outbox", "notify"),
    ):
        lines.append(f"  {label:44} p50 {r[key + '_p50']:7.1f} ms, p99 {r[key + '_p99']:7.1f} ms")
    ratio = r["notify_p50"] / r["poll_p50"] if r["poll_p50"] > 0 else float("nan")
    run.target(report.Target("enqueue -> provider p50, woken by NOTIFY", r["notify_p50"], 50.0, "<=", " ms"))
    run.target(report.Target("enqueue -> provider p50, NOTIFY / polling every 500 ms", ratio, 0.2, "<="))
    return "\n".join(lines)


HELP = "sender against the fake provider (--latency: NOTIFY vs polling)"


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--messages", type=int, default=None, help="default 10000 (200 with --latency)")
    p.add_argument("--recipients", type=int, default=1000)
    p.add_argument("--batch", type=int, default=500)
    p.add_argument("--concurrency", type=int, default=256)
    p.add_argument("--loops", type=int, default=3)
    p.add_argument("--pair-interval", type=float, default=0.0, help="seconds; 0 so pacing is not the limit")
    p.add_argument("--latency", action="store_true", help="enqueue->provider latency at a low rate")
    p.add_argument("--rate", type=float, default=20.0, help="--latency: enqueues per second")


async def main(args: argparse.Namespace) -> int:
    run = contract.Run(args, key="bench-send-latency" if args.latency else None)
    args.log_dir = run.log_dir
    if args.messages is None:
        args.messages = 200 if args.latency else 10000
    with database.server("bench-send") as (admin_dsn, _embedded):
        async with scratch_database(admin_dsn, "bench_send") as dsn:
            result = await (_latency(dsn, args) if args.latency else _run(dsn, args))
    if args.latency:
        return run.finish(result, _report_latency(result, args, run))
    text = (
        f"sender: {result['sends_per_s']:.0f} sends/s "
        f"({result['messages']} messages to {result['recipients']} recipients in {result['seconds']:.2f} s; "
        f"accepted {result['accepted']}, fake received {result['received']})\n"
        f"baseline (bare aiohttp client, same fake, no database): {result['baseline_per_s']:.0f} sends/s; "
        f"sender/baseline = {result['sends_per_s'] / result['baseline_per_s']:.2f}"
    )
    run.target(report.Target("sends to many recipients", result["sends_per_s"], 1000.0, ">=", "/s"))
    run.check(
        "every message accepted and received exactly once",
        result["accepted"] == result["messages"] == result["received"],
        f"{result['messages']} messages, {result['accepted']} accepted, {result['received']} received",
    )
    return run.finish(result, text)
