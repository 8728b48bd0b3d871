"""Sender throughput against the fake provider: sends per second to many distinct recipients.

    python -m loadtest bench-send [--messages 10000] [--recipients 1000]
    python -m loadtest bench-send --latency [--rate 20] [--messages 200]
    python -m loadtest bench-send --mix [--messages 10000] [--rounds 3] [--seconds 10]

``--latency``: enqueue→provider latency at a low rate (one enqueue transaction per message, as
the send API does; latency = the fake's arrival stamp minus the commit), p50/p99, for a sender
that only polls every 500 ms (the default poll, i.e. before NOTIFY: the baseline) and for one
woken by NOTIFY ``outbox``, in the same run. Target: NOTIFY p50 <= 50 ms and <= 1/5 of the
polling p50; exits 1 when missed.

``--mix``: the realistic mix (loadtest.harness.sendmix): customers get one message each, except a
fifth of them who get 2-5 (``--repeat-share``), in arrival order (a customer's messages spread
through the stream). 10 000 messages so make about 6 700 customers (a thousand customers could
not receive them with four fifths getting one). Each round enqueues the mix at once and lets a
``gateway send`` process drain it, with the pair limit off (``GATEWAY_PAIR_INTERVAL_S=0``) and
on (``--mix-pair-interval``, default 6 s), which goes first alternating (4 rounds by default,
after a warm-up drain that is not counted); then the mix at half of the pair-off saturation
(open model: every 5 ms, what is due enqueued in one statement), pair limit on.
Figures from the fake provider's record:
- sends/s while the sender had a backlog: messages that reached the provider while at least 100
  were allowed to go and had not (a message may go from the start, or from its customer's
  previous arrival plus the pair interval), over that time. Time in which only pair waits remain,
  or a few messages trickle out as their waits end, is not the sender's throughput. The plain
  rate (messages / first to last arrival) is shown beside it, and how late after its wait ended
  each held-back message arrived. Target: pair on / off >= 0.9 (median of the rounds): the pair
  waits cost only the repeat customers.
- the p99 latency of the messages of single-message customers, enqueued (the row's insert, by
  the database's clock) -> arrival at the provider, at half the saturation: <= 100 ms. Shown
  beside it: the same from each message's scheduled time, and how late the generator enqueued
  (if this process falls behind its schedule on a busy machine, the arrivals bunch up).
- per-customer order inversions (a message taken by the provider before an earlier one of its
  customer), every phase: 0.
Every message must be accepted and received once. Exits 1 when a target is missed.

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
import random
import statistics
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import orjson

from gateway.core.settings import Settings
from gateway.outbound.sender import Sender
from gateway.store import outbox
from gateway.store.db import connect, create_pool, migrate
from gateway.testing.scratch import scratch_database
from loadtest.harness import contract, database, processes, report, sendmix
from loadtest.harness.sql import q
from loadtest.harness.stats import machine, percentile

TARGET_MIX_RATIO = 0.9
TARGET_MIX_P99_MS = 100.0


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
        async with pool.acquire() as conn:
            await outbox.enqueue(conn, m)
            # As the send front ends do after their commit (gateway.outbound.wake, in a process
            # without a sender of its own).
            await outbox.wake_senders(conn)
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


# ---- --mix ----------------------------------------------------------------------------------
async def _mix(dsn: str, args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    rng = random.Random(args.seed)
    result: dict[str, Any] = {}
    fake = processes.start_fake_provider(dsn, processes.DEFAULT_SECRETS, log_dir, webhook_url="")
    try:
        await fake.wait_ready(path=None)
        conn = await connect(dsn)
        await migrate(conn)
        await conn.close()
        pool = await create_pool(dsn, 2, 16)
        try:
            async with aiohttp.ClientSession() as http:
                env = sendmix.Env(dsn, pool, fake.url, log_dir, _sender_env(fake.url, args), http)
                result["rounds"] = await _mix_rounds(env, args, rng)
                offs = [r["off"]["plain_sends_per_s"] for r in result["rounds"]]
                saturation = statistics.median(offs) if offs else float("nan")
                rate = args.rate_mix or saturation / 2
                customers = sendmix.mix(max(1, int(rate * args.seconds)), args.repeat_share, 2, 5, rng)
                phase, ms = await sendmix.latency(env, "lat", "1999", customers, rate, args.mix_pair_interval)
                result["latency"] = {
                    "rate": rate,
                    "saturation": saturation,
                    **phase.figures(),
                    **sendmix.first_message_latency(customers, ms),
                    "enqueue_lag_p99_ms": percentile(phase.lag_ms, 99),
                    **{
                        f"scheduled_{k}": v
                        for k, v in sendmix.first_message_latency(customers, phase.scheduled_ms).items()
                    },
                }
        finally:
            await pool.close()
    finally:
        fake.stop()
    return result


async def _mix_rounds(env: sendmix.Env, args: argparse.Namespace, rng: random.Random) -> list[dict[str, Any]]:
    # A first drain warms the database, the fake and the page cache; it is not counted.
    await sendmix.drain(env, "warmup", "1900", sendmix.mix(1000, args.repeat_share, 2, 5, rng), 0.0)
    rounds = []
    for n in range(args.rounds):
        customers = sendmix.mix(args.messages, args.repeat_share, 2, 5, rng)
        runs = {}
        # Alternating which goes first, so neither always runs on the warmer machine.
        order = [("off", 0.0), ("on", args.mix_pair_interval)]
        for label, pair in order if n % 2 == 0 else order[::-1]:
            number = f"1{n:02d}{0 if label == 'off' else 1}"
            phase = await sendmix.drain(env, f"r{n}{label}", number, customers, pair)
            runs[label] = phase.figures()
        ratio = runs["on"]["sends_per_s"] / runs["off"]["sends_per_s"] if runs["off"]["sends_per_s"] else 0.0
        rounds.append({**runs, "ratio": ratio})
        print(
            f"round {n + 1}: pair off {runs['off']['sends_per_s']:.0f} sends/s, "
            f"pair on {runs['on']['sends_per_s']:.0f} sends/s (with a backlog), on/off {ratio:.3f}",
            flush=True,
        )
    return rounds


def _sender_env(fake_url: str, args: argparse.Namespace) -> dict[str, str]:
    return {
        "GATEWAY_GRAPH_URL": f"{fake_url}/v21.0",
        "GATEWAY_GRAPH_TOKEN": "bench",
        "GATEWAY_NUMBER_RATE_PER_S": "1000000",
        "GATEWAY_SEND_BATCH": str(args.batch),
        "GATEWAY_SEND_CONCURRENCY": str(args.concurrency),
        "GATEWAY_SEND_LOOPS": str(args.loops),
    }


def mix_verdict(r: dict[str, Any]) -> report.Verdict:
    rounds, lat = r["rounds"], r["latency"]
    phases = [run for x in rounds for run in (x["off"], x["on"])] + [lat]
    v = report.Verdict(
        targets=[
            report.Target(
                f"sends/s pair limit on / off (median of {len(rounds)})",
                statistics.median(x["ratio"] for x in rounds) if rounds else None,
                TARGET_MIX_RATIO,
                ">=",
                "x",
            ),
            report.Target(
                "single-message customers' enqueue -> provider p99 at half saturation",
                lat["single_p99_ms"],
                TARGET_MIX_P99_MS,
                "<=",
                " ms",
            ),
            report.Target("per-customer order inversions", sum(p["inversions"] for p in phases), 0, "<="),
        ],
        notes=[machine()],
    )
    for name, p in [(f"round {i + 1} {k}", x[k]) for i, x in enumerate(rounds) for k in ("off", "on")] + [
        ("latency", lat)
    ]:
        if not p["messages"] == p["received"] == p["accepted"] or p["duplicates"]:
            v.failed_checks.append(
                f"{name}: {p['messages']} messages, {p['received']} received "
                f"({p['duplicates']} twice), {p['accepted']} accepted"
            )
    return v


def mix_table(r: dict[str, Any]) -> str:
    rows: list[tuple[Any, ...]] = []
    for i, x in enumerate(r["rounds"]):
        for k in ("off", "on"):
            p = x[k]
            rows.append(
                (
                    f"round {i + 1} pair {k}",
                    p["messages"],
                    p["customers"],
                    f"{p['sends_per_s']:.0f}",
                    f"{p['plain_sends_per_s']:.0f}",
                    f"{p['busy_s']:.2f}",
                    f"{p['span_s']:.2f}",
                    p["held_back"],
                    report.fmt_ms(p["held_back_late_p99_ms"]),
                    p["inversions"],
                )
            )
    lat = r["latency"]
    out = report.table(
        (
            "run",
            "messages",
            "customers",
            "sends/s backlog",
            "sends/s plain",
            "backlog s",
            "first-last s",
            "held back",
            "late p99 ms",
            "inversions",
        ),
        rows,
    )
    out += (
        f"\n\nat {lat['rate']:.0f} messages/s (half of the pair-off saturation, {lat['saturation']:.0f}/s), "
        f"pair limit on, {lat['messages']} messages to {lat['customers']} customers:\n"
        f"  single-message customers ({lat['single_n']}), enqueued -> provider: "
        f"p50 {lat['single_p50_ms']:.1f} ms, p99 {lat['single_p99_ms']:.1f} ms, "
        f"max {lat['single_max_ms']:.1f} ms\n"
        f"  (from the scheduled time: p50 {lat['scheduled_single_p50_ms']:.1f} ms, "
        f"p99 {lat['scheduled_single_p99_ms']:.1f} ms; the generator's enqueue, scheduled -> inserted: "
        f"p99 {lat['enqueue_lag_p99_ms']:.1f} ms)\n"
        f"  first message of repeat customers: p99 {lat['repeat_first_p99_ms']:.1f} ms; "
        f"held back {lat['held_back']}, late p99 {report.fmt_ms(lat['held_back_late_p99_ms'])} ms; "
        f"inversions {lat['inversions']}"
    )
    return out


HELP = "sender against the fake provider (--latency: NOTIFY vs polling; --mix: pacing's cost)"


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--messages", type=int, default=None, help="default 10000 (200 with --latency)")
    p.add_argument("--recipients", type=int, default=1000)
    p.add_argument("--batch", type=int, default=500)
    p.add_argument("--concurrency", type=int, default=256)
    p.add_argument("--loops", type=int, default=3)
    p.add_argument("--pair-interval", type=float, default=0.0, help="seconds; 0 so pacing is not the limit")
    p.add_argument("--latency", action="store_true", help="enqueue->provider latency at a low rate")
    p.add_argument("--rate", type=float, default=20.0, help="--latency: enqueues per second")
    p.add_argument("--mix", action="store_true", help="the realistic mix: pair limit on against off")
    p.add_argument(
        "--rounds", type=int, default=4, help="--mix: drains of the mix, pair off and on (each first in half)"
    )
    p.add_argument("--seconds", type=float, default=10.0, help="--mix: length of the latency phase")
    p.add_argument("--repeat-share", type=float, default=0.2, help="--mix: customers with 2-5 messages")
    p.add_argument("--mix-pair-interval", type=float, default=6.0, help="--mix: the pair interval when on")
    p.add_argument(
        "--rate-mix", type=float, default=0.0, help="--mix: latency phase rate (default: half the saturation)"
    )
    p.add_argument("--seed", type=int, default=1)


async def main(args: argparse.Namespace) -> int:
    key = "bench-send-latency" if args.latency else "bench-send-mix" if args.mix else None
    run = contract.Run(args, key=key)
    args.log_dir = run.log_dir
    if args.messages is None:
        args.messages = 200 if args.latency else 10000
    if args.mix:
        with database.server("bench-send") as (admin_dsn, _embedded):
            async with scratch_database(admin_dsn, "bench_send") as dsn:
                mixed = await _mix(dsn, args, run.log_dir)
        verdict = mix_verdict(mixed)
        return run.finish(mixed, mix_table(mixed), verdict=verdict)
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
