"""Graph-compatible send answered with the wamid: latency at half of the sender's saturation.

    python -m loadtest bench-graph [--messages 3000] [--seconds 10]

Self-contained: PostgreSQL (DATABASE_URL's server, else an embedded one; a scratch database),
the fake provider and ``gateway serve`` (one worker: HTTP and the sender, no consumers; pacing
out of the way: pair interval 0, number rate 1e6/s) each in its own process, the load generator
in this one.

1. Saturation: ``--messages`` rows enqueued at once; the gateway's sender sends them to the
   fake; sends/s = rows / time until none is pending or sending. Twice, the best kept.
2. Latency: ``POST /v23.0/1111/messages`` with Meta's body (no Idempotency-Key, a different
   recipient each, so no pacing wait) at half that rate for ``--seconds``, open model: each
   request starts at its scheduled time and its latency runs from that time to the answer.
   Every answer must be 200 with the fake's wamid. Target: p99 <= 50 ms.
   Beside it, in the same run and at the same rate, the same bodies posted straight to the
   fake provider (what a bot calling Meta directly waits for the HTTP exchange alone).

Exits 1 when the target is missed or an answer is not Meta's 200 with a wamid.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import asyncpg
import orjson

from gateway.store.db import create_pool
from gateway.testing.scratch import scratch_database
from loadtest.harness import contract, database, processes, report
from loadtest.harness.sql import q
from loadtest.harness.stats import percentile

HELP = "Graph-compatible send answered with the wamid: p99 at half the sender's saturation"
TARGET_P99_MS = 50.0
API_KEY = "bench-graph-api-key-0123456789"


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--messages", type=int, default=3000, help="rows per saturation round")
    p.add_argument("--seconds", type=float, default=10.0, help="latency phase length")
    p.add_argument("--concurrency", type=int, default=256, help="requests in flight at most")
    p.add_argument("--rate", type=float, default=0.0, help="requests/s instead of half the saturation")


@contextlib.asynccontextmanager
async def _running(dsn: str, log_dir: Path) -> AsyncIterator[tuple[str, str]]:
    """The fake provider and the gateway; (gateway URL, fake URL)."""
    procs: list[processes.Proc] = []
    try:
        await processes.migrate(dsn)
        fake = processes.start_fake_provider(dsn, processes.DEFAULT_SECRETS, log_dir, webhook_url="")
        procs.append(fake)
        await fake.wait_ready(path=None)
        gw = processes.start_gateway(
            dsn,
            processes.DEFAULT_SECRETS,
            log_dir,
            consumers=False,
            extra={
                "GATEWAY_DATA_DIR": str(log_dir),
                "GATEWAY_RUN_SENDER": "true",
                "GATEWAY_RUN_FORWARDER": "false",
                "GATEWAY_GRAPH_URL": f"{fake.url}/v21.0",
                "GATEWAY_GRAPH_TOKEN": "bench",
                "GATEWAY_API_KEYS": f"bench:{API_KEY}",
                "GATEWAY_PAIR_INTERVAL_S": "0",
                "GATEWAY_NUMBER_RATE_PER_S": "1000000",
                "GATEWAY_GRAPH_COMPAT_WAIT_MS": "5000",
            },
        )
        procs.append(gw)
        await gw.wait_ready()
        yield gw.url, fake.url
    finally:
        for p in reversed(procs):
            p.stop()


async def _saturation(pool: asyncpg.Pool, n: int, tag: str) -> float:
    """Sends per second of the gateway's sender draining ``n`` queued rows."""
    keys = [f"{tag}-{i}" for i in range(n)]
    recips = [f"49152{i:08d}" for i in range(n)]
    payload = {"type": "text", "text": {"body": "bench"}}
    started = time.perf_counter()
    await pool.execute(q("lt_outbox_enqueue_bulk"), tag, "meta", "1111", payload, keys, recips)
    unsent = n
    while unsent:
        await asyncio.sleep(0.01)
        unsent = await pool.fetchval(q("lt_outbox_unsent"))
    elapsed = time.perf_counter() - started
    accepted = await pool.fetchval(
        "SELECT count(*) FROM outbox WHERE tenant = $1 AND state = 'accepted'", tag
    )
    if accepted != n:
        raise RuntimeError(f"saturation round {tag}: {accepted} of {n} accepted")
    return n / elapsed


def _body(i: int) -> bytes:
    return orjson.dumps({"messaging_product": "whatsapp", "recipient_type": "individual",
                         "to": f"49153{i:08d}", "type": "text", "text": {"body": f"graph {i}"}})  # fmt: skip


async def _open_model(
    http: aiohttp.ClientSession, url: str, headers: dict[str, str], rate: float, seconds: float, first: int
) -> tuple[list[float], list[str]]:
    """Requests at ``rate`` per second for ``seconds``: latencies (ms, from each request's
    scheduled start) and what was wrong with the answers that were not 200 with a wamid."""
    n = int(rate * seconds)
    latencies: list[float] = []
    wrong: list[str] = []

    async def one(i: int, intended: float) -> None:
        try:
            async with http.post(url, data=_body(first + i), headers=headers) as r:
                raw = await r.read()
                ok = r.status == 200 and str(orjson.loads(raw)["messages"][0]["id"]).startswith("wamid.")
                if not ok:
                    wrong.append(f"HTTP {r.status}: {raw[:120]!r}")
        except (aiohttp.ClientError, TimeoutError, ValueError, KeyError) as exc:
            wrong.append(f"{type(exc).__name__}: {exc}")
        latencies.append((time.perf_counter() - intended) * 1000)

    tasks = []
    start = time.perf_counter() + 0.05
    for i in range(n):
        intended = start + i / rate
        delay = intended - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(i, intended)))
    await asyncio.gather(*tasks)
    return latencies, wrong


async def _where_time_went(dsn: str) -> dict[str, dict[str, float]]:
    """Per Graph-compatible row: commit -> claimed by the sender, claimed -> accepted recorded."""
    pool = await create_pool(dsn, 1, 2)
    try:
        rows = await pool.fetch(
            "SELECT extract(epoch FROM sending_at - created_at) * 1000 AS queued,"
            "       extract(epoch FROM accepted_at - sending_at) * 1000 AS sent "
            "FROM outbox WHERE idem_key LIKE 'graph.%' AND accepted_at IS NOT NULL"
        )
    finally:
        await pool.close()
    return {
        name: _summary([float(r[name]) for r in rows]) if rows else {}
        for name in ("queued", "sent")
    }


def _summary(latencies: list[float]) -> dict[str, float]:
    return {"p50": percentile(latencies, 50), "p99": percentile(latencies, 99), "max": max(latencies)}


def judge(run: contract.Run, p99_ms: float, wrong: int, rate: float, half: float) -> None:
    """The target holds at half the sender's saturation: a run at another ``--rate`` says so
    and judges only the answers."""
    if abs(rate - half) > 0.5:
        run.note(f"run at {rate:.0f}/s, not at half the sender's saturation ({half:.0f}/s): p99 not judged")
    else:
        name = "graph-compatible send p99 at half the sender's saturation"
        run.target(report.Target(name, p99_ms, TARGET_P99_MS, "<=", " ms"))
    run.check("every answer 200 with a wamid", not wrong, f"{wrong} were not")


async def _run(dsn: str, args: argparse.Namespace, run: contract.Run) -> str:
    with tempfile.TemporaryDirectory(prefix="bench-graph-") as tmp:
        async with _running(dsn, Path(tmp)) as (gw_url, fake_url):
            pool = await create_pool(dsn, 1, 4)
            try:
                rounds = [await _saturation(pool, args.messages, f"sat{r}") for r in range(2)]
            finally:
                await pool.close()
            saturation = max(rounds)
            rate = args.rate or saturation / 2
            connector = aiohttp.TCPConnector(limit=args.concurrency)
            timeout = aiohttp.ClientTimeout(total=30)
            async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
                auth = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}
                graph = f"{gw_url}/v23.0/1111/messages"
                await _open_model(http, graph, auth, min(rate, 50.0), 1.0, 10_000_000)  # warm-up
                lat, wrong = await _open_model(http, graph, auth, rate, args.seconds, 0)
                parts = await _where_time_went(dsn)
                direct = f"{fake_url}/v21.0/1111/messages"
                base, base_wrong = await _open_model(
                    http, direct, {"Authorization": "Bearer bench"}, rate, args.seconds, 20_000_000
                )
    g, b = _summary(lat), _summary(base)
    judge(run, g["p99"], len(wrong), rate, saturation / 2)
    run.figures = {"saturation": rounds, "rate": rate, "graph_ms": g, "direct_ms": b, "parts": parts}
    lines = [f"sender saturation: {', '.join(f'{r:.0f}' for r in rounds)} sends/s (best {saturation:.0f})"]
    lines.append(
        f"graph-compatible sends at {rate:.0f}/s for {args.seconds:.0f} s ({len(lat)} requests): "
        f"p50 {g['p50']:.1f} ms, p99 {g['p99']:.1f} ms, max {g['max']:.1f} ms; "
        f"{len(wrong)} not answered 200 with a wamid"
    )
    lines.append(
        f"baseline, the same bodies straight to the fake provider at {rate:.0f}/s: "
        f"p50 {b['p50']:.1f} ms, p99 {b['p99']:.1f} ms, max {b['max']:.1f} ms ({len(base_wrong)} wrong)"
    )
    for name, what in (("queued", "commit -> claimed by the sender"), ("sent", "claimed -> accepted")):
        x = parts.get(name) or {}
        if x:
            lines.append(f"  {what}: p50 {x['p50']:.1f} ms, p99 {x['p99']:.1f} ms")
    for w in wrong[:5]:
        lines.append(f"  {w}")
    return "\n".join(lines)


async def main(args: argparse.Namespace) -> int:
    run = contract.Run(args)
    with database.server("bench-graph") as (admin_dsn, _embedded):
        async with scratch_database(admin_dsn, "bench_graph") as dsn:
            text = await _run(dsn, args, run)
    return run.finish({}, text)
