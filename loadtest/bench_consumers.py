"""Consumer throughput: the set-based consumers vs one event per transaction and vs PGQueuer,
side by side on the same PostgreSQL, ``--rounds`` times.

    python -m loadtest bench-consumers [--events 10000] [--concurrency 2] [--batch 1000] [--rounds 3]

Starts an embedded PostgreSQL in a temporary directory (or uses DATABASE_URL, in a fresh
database it creates and drops), stages a realistic mix as webhook_inbox rows (one update
per webhook, as Meta mostly sends them): for each outbox row its sent, delivered and read
statuses in shuffled order, inbound messages, and a share of redeliveries. Each strategy
drains the same rows from the same starting state; the database is then checked (every
key once, every outbox row read) and events/s printed for both. The peer, PGQueuer
(loadtest.harness.peer), drains as many no-op jobs with ``--peer-dequeuers`` queue managers at
each of ``--peer-batches``; its best batch is the peer of the round. Targets, on the median of
the rounds' ratios: the consumers >= 5x one transaction per event and >= 2x PGQueuer. Each
strategy's CPU per event is printed beside its rate: this process's and, when the server runs
on this machine, PostgreSQL's (its postmaster and backends, from /proc). The last round's
consumer statements are printed from pg_stat_statements (calls per event, mean and total time,
share).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import random
import statistics
import sys
import time
from typing import Any

import asyncpg

from gateway.core.events import InboundMessage, Status, event_day, subject_of
from gateway.core.parsing import parse
from gateway.core.settings import Settings
from gateway.runtime.process import tune_gc
from gateway.store.db import connect, create_pool, migrate
from gateway.testing.scratch import scratch_database
from loadtest.harness import consumers, contract, database, peer, pgstat, report
from loadtest.harness.consumers import stage, workload
from loadtest.harness.cpu import CpuMeter, tree
from loadtest.harness.sql import queries

BASELINE = queries("baseline.sql")


async def run_set_based(pool: asyncpg.Pool, settings: Settings) -> None:
    await consumers.drain(pool, settings)


async def _naive_one(conn: asyncpg.Connection | asyncpg.pool.PoolConnectionProxy) -> bool:
    async with conn.transaction():
        row = await conn.fetchrow(BASELINE["naive_claim_one"])
        if row is None:
            return False
        for ev in parse(row["source"], bytes(row["body"]), row["delivery_id"]):
            day = event_day(ev, row["source"])
            subject = subject_of(ev.key)
            if await conn.fetchval(BASELINE["naive_claim_key"], ev.key, row["id"], day, subject) is None:
                continue  # duplicate
            if isinstance(ev, InboundMessage):
                await conn.execute(
                    BASELINE["naive_insert_message"],
                    ev.wamid,
                    row["source"],
                    ev.phone_number_id,
                    ev.sender,
                    ev.type,
                    ev.timestamp,
                    ev.contact_name,
                    ev.message,
                    row["id"],
                    subject,
                )
            elif isinstance(ev, Status):
                await conn.execute(
                    BASELINE["naive_insert_status"],
                    ev.key,
                    row["source"],
                    ev.wamid,
                    ev.status,
                    ev.participant,
                    ev.recipient,
                    ev.timestamp,
                    ev.callback_data,
                    ev.errors,
                    ev.raw,
                    row["id"],
                    subject,
                )
                await conn.execute(
                    BASELINE["naive_update_outbox"], ev.callback_data, ev.wamid, ev.status, ev.errors
                )
        await conn.execute(BASELINE["naive_done"], row["id"])
    return True


async def run_naive(pool: asyncpg.Pool, settings: Settings) -> None:
    async def loop() -> None:
        async with pool.acquire() as conn:
            while await _naive_one(conn):
                pass

    await asyncio.gather(*(loop() for _ in range(settings.consumer_concurrency)))


async def measure(
    name: str,
    runner: Any,
    pool: asyncpg.Pool,
    settings: Settings,
    bodies: list[bytes],
    outbox_rows: int,
    expect: dict[str, int],
    run: contract.Run,
    meter: CpuMeter,
    statements: bool = False,
) -> tuple[float, float, list[dict[str, Any]] | None]:
    """Events/s of one strategy draining the staged rows and the CPU it took an event (``meter``'s
    processes, in µs); with ``statements``, the top statements of the drain (pg_stat_statements;
    None when the server has not loaded it)."""
    await stage(pool, bodies, outbox_rows)
    dsn = settings.database_url or ""
    counting = statements and await pgstat.reset(dsn)
    meter.start()
    started = time.perf_counter()
    await runner(pool, settings)
    elapsed = time.perf_counter() - started
    cpu = cpu_us(meter, len(bodies))
    top = await pgstat.top(dsn) if counting else None
    check = await consumers.check(pool)
    run.check(f"{name}: every event exactly once", check == expect, f"got {check}, want {expect}")
    rate = len(bodies) / elapsed
    sys.stderr.write(
        f"{name:28} {len(bodies):>7} events in {elapsed:7.2f} s = {rate:>9,.0f} events/s, "
        f"{cpu:6.1f} µs CPU each\n"
    )
    return rate, cpu, top


async def bench(dsn: str, ns: argparse.Namespace, run: contract.Run) -> tuple[dict[str, Any], str]:
    settings = dataclasses.replace(
        Settings(), database_url=dsn, consumer_concurrency=ns.concurrency, consumer_batch=ns.batch
    )
    conn = await connect(dsn)
    try:
        await migrate(conn)
    finally:
        await conn.close()
    await peer.install(dsn)
    rng = random.Random(ns.seed)
    bodies, outbox_rows = workload(ns.events, ns.redeliveries, rng)
    expect = consumers.expected(bodies, outbox_rows)
    lines = [
        f"workload: {len(bodies)} staged events ({expect['statuses']} statuses "
        f"for {outbox_rows} outbox rows, {expect['messages']} inbound messages, "
        f"{len(bodies) - expect['keys']} redeliveries); concurrency {ns.concurrency}, batch {ns.batch}; "
        f"PGQueuer: {len(bodies)} no-op jobs, {ns.peer_dequeuers} dequeuers, batch {ns.peer_batches}"
    ]
    batches = [int(x) for x in ns.peer_batches.split(",") if x.strip()]
    rates: dict[str, list[float]] = {"naive": [], "consumers": [], **{f"pgqueuer b{b}": [] for b in batches}}
    cpu: dict[str, list[float]] = {k: [] for k in rates}
    statements: list[dict[str, Any]] | None = None
    pool = await create_pool(dsn, 1, ns.concurrency + 2)
    try:
        async with pool.acquire() as c:
            postmaster = await database.local_postmaster(c)

        def meter() -> CpuMeter:
            return CpuMeter(0, None, groups=lambda: {"bench": [os.getpid()], "pg": postgres(postmaster)})

        for rnd in range(ns.rounds):
            naive, naive_cpu, _ = await measure(
                "one event per transaction", run_naive, pool, settings, bodies, outbox_rows, expect, run,
                meter(),
            )  # fmt: skip
            fast, fast_cpu, top = await measure(
                "set-based consumers", run_set_based, pool, settings, bodies, outbox_rows, expect, run,
                meter(), statements=rnd == ns.rounds - 1,
            )  # fmt: skip
            rates["naive"].append(naive)
            rates["consumers"].append(fast)
            cpu["naive"].append(naive_cpu)
            cpu["consumers"].append(fast_cpu)
            statements = top or statements
            for b in batches:
                m = meter()
                rate = await peer.drain(dsn, len(bodies), b, ns.peer_dequeuers, m)
                used = cpu_us(m, len(bodies))
                sys.stderr.write(
                    f"PGQueuer, batch {b:<4} {len(bodies):>13} jobs = {rate:>9,.0f} jobs/s, "
                    f"{used:6.1f} µs CPU each\n"
                )
                rates[f"pgqueuer b{b}"].append(rate)
                cpu[f"pgqueuer b{b}"].append(used)
    finally:
        await pool.close()
    # The round's best batch: its rate is the peer's, its CPU the peer's CPU.
    best = [max((rates[f"pgqueuer b{b}"][i], b) for b in batches)[1] for i in range(ns.rounds)]
    best_peer = [rates[f"pgqueuer b{b}"][i] for i, b in enumerate(best)]
    best_peer_cpu = [cpu[f"pgqueuer b{b}"][i] for i, b in enumerate(best)]
    run.median(
        "consumers / one transaction per event", _ratios(rates["consumers"], rates["naive"]), 5.0, ">=", "x"
    )
    run.median(
        "consumers / PGQueuer no-op jobs (its best batch)",
        _ratios(rates["consumers"], best_peer),
        2.0,
        ">=",
        "x",
    )
    where = "this process and PostgreSQL" if postmaster else "this process only (PostgreSQL is elsewhere)"
    lines.append(report.table(
        ("strategy", "median/s", "rounds/s", "CPU µs/event (median)"),
        [(k, f"{statistics.median(v):,.0f}", " / ".join(f"{x:,.0f}" for x in v),
          f"{statistics.median(cpu[k]):.1f}") for k, v in rates.items()],
    ))  # fmt: skip
    peer_over_ours = statistics.median(_ratios(best_peer_cpu, cpu["consumers"]))
    lines.append(
        f"CPU per event, {where}: the consumers {statistics.median(cpu['consumers']):.1f} µs, PGQueuer's "
        f"best batch of each round {statistics.median(best_peer_cpu):.1f} µs a no-op job; its CPU / the "
        f"consumers' (median of the rounds) {peer_over_ours:.2f}x"
    )
    if statements is None:
        lines.append("pg_stat_statements: not loaded on this server (an embedded one has it)")
    else:
        lines.append(pgstat.describe(statements, len(bodies), "event", " (the consumers, the last round)"))
    figures = {"events": len(bodies), "rates": rates, "cpu_us_per_event": cpu, "statements": statements}
    return figures, "\n\n".join(lines)


def cpu_us(meter: CpuMeter, n: int) -> float:
    """µs of CPU each of ``n`` events or jobs took: all ``meter``'s processes since its start."""
    return sum(meter.used().values()) / n * 1e6


def postgres(postmaster: int | None) -> list[int]:
    """The local server's processes now (none when it is not on this machine)."""
    return tree(postmaster) if postmaster else []


def _ratios(a: list[float], b: list[float]) -> list[float]:
    return [x / y for x, y in zip(a, b, strict=True) if y]


HELP = "set-based consumers vs one transaction per event and vs PGQueuer"


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--events", type=int, default=10000, help="staged events, redeliveries included")
    p.add_argument("--redeliveries", type=float, default=0.1, help="share of events delivered twice")
    p.add_argument("--concurrency", type=int, default=2, help="consumer loops, the same for both")
    p.add_argument(
        "--batch", type=int, default=Settings().consumer_batch, help="rows per batch (set-based consumers)"
    )
    p.add_argument("--rounds", type=int, default=3, help="rounds (the median ratio is judged)")
    p.add_argument("--peer-batches", default="10,100", help="PGQueuer batch sizes (its best is the peer)")
    p.add_argument("--peer-dequeuers", type=int, default=5, help="PGQueuer queue managers")
    p.add_argument("--seed", type=int, default=1)


async def main(ns: argparse.Namespace) -> int:
    # The consumers run here with the collector settings of `gateway consume`; PGQueuer, run
    # in this process too, gets them as well.
    tune_gc()
    run = contract.Run(ns)
    with database.server("bench-consumers", statements=True) as (admin_dsn, _embedded):
        async with scratch_database(admin_dsn, "bench_consumers") as dsn:
            figures, text = await bench(dsn, ns, run)
    return run.finish(figures, text)
