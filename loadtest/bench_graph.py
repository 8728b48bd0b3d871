"""Graph-compatible send answered with the wamid: latency at a quarter and at half of the
sender's saturation.

    python -m loadtest bench-graph [--messages 3000] [--seconds 10] [--services process|inline]

Self-contained: PostgreSQL (DATABASE_URL's server, else an embedded one; a scratch database),
the fake provider and ``gateway serve`` (one HTTP worker and the sender, no consumers; pacing
out of the way: pair interval 0, number rate 1e6/s) in processes of their own, the load
generator in this one. ``--services process`` (the default, what ``gateway serve`` does on two
cores or more) runs the sender in a services process beside the HTTP worker, so a request's
row reaches the sender by NOTIFY and its outcome comes back by NOTIFY; ``inline`` runs the
sender inside the HTTP worker.

1. Saturation: ``--messages`` rows enqueued at once; the gateway's sender sends them to the
   fake; sends/s = rows / time until none is pending or sending. Twice, the best kept.
2. Latency: ``POST /v23.0/1111/messages`` with Meta's body (no Idempotency-Key, a different
   recipient each, so no pacing wait) at a quarter, then at half of that rate for ``--seconds``
   each, open model: each request starts at its scheduled time and its latency runs from that
   time to the answer. Every answer must be 200 with the fake's wamid. Where each row's time
   went (commit -> claimed by the sender -> accepted recorded), the cores each process used
   and, where the server loads pg_stat_statements, the statements per request.
3. Baseline, in the same run and at the same rate: the same bodies posted straight to the fake
   provider (what a bot calling Meta directly waits for the HTTP exchange alone).

Targets (loadtest.harness.report.Verdict): p99 <= 50 ms at half and at a quarter of the
sender's saturation (latency does not grow with the rate below saturation), the answers
keeping up with the schedule, every answer 200 with a wamid. Exits 1 when one is missed. With
``--rate`` one phase runs at that rate and only its answers are judged.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import orjson
import psutil

from gateway.store.db import create_pool
from gateway.testing.scratch import scratch_database
from loadtest.harness import contract, database, processes
from loadtest.harness.cpu import CpuMeter, tree
from loadtest.harness.httpclient import HttpError, Pool
from loadtest.harness.report import MIN_RATE_SHARE, Target, Verdict
from loadtest.harness.sql import q
from loadtest.harness.stats import machine, percentile

HELP = "Graph-compatible send answered with the wamid: p99 at a quarter and half the sender's saturation"
TARGET_P99_MS = 50.0
API_KEY = "bench-graph-api-key-0123456789"
# The phases' rates, as shares of the sender's saturation.
SHARES = {"a quarter": 0.25, "half": 0.5}


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--messages", type=int, default=3000, help="rows per saturation round")
    p.add_argument("--seconds", type=float, default=10.0, help="length of each latency phase")
    p.add_argument("--concurrency", type=int, default=256, help="requests in flight at most")
    p.add_argument("--rate", type=float, default=0.0, help="one phase at this many requests/s instead")
    p.add_argument(
        "--services",
        choices=("process", "inline"),
        default="process",
        help="the sender in a process beside the HTTP worker (gateway serve on 2+ cores), or in it",
    )


@dataclass(frozen=True, slots=True)
class Gateway:
    port: int
    fake_port: int
    serve_pid: int
    fake_pid: int


@contextlib.asynccontextmanager
async def _running(dsn: str, log_dir: Path, services: str) -> AsyncIterator[Gateway]:
    """The fake provider and the gateway."""
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
                "GATEWAY_SERVE_SERVICES": services,
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
        yield Gateway(gw.port, fake.port, gw.pid, fake.pid)
    finally:
        for p in reversed(procs):
            p.stop()


@dataclass(frozen=True, slots=True)
class Saturation:
    """A backlog drained: sends per second, and the cores each process used meanwhile."""

    rate: float
    elapsed_s: float
    cores: dict[str, float]


async def _saturation(pool: asyncpg.Pool, gw: Gateway, n: int, tag: str) -> Saturation:
    """The gateway's sender draining ``n`` queued rows."""
    keys = [f"{tag}-{i}" for i in range(n)]
    recips = [f"49152{i:08d}" for i in range(n)]
    payload = {"type": "text", "text": {"body": "bench"}}
    meter = await _meter(pool, gw)
    meter.start()
    started = time.perf_counter()
    async with pool.acquire() as conn:
        await conn.execute(q("lt_outbox_enqueue_bulk"), tag, "meta", "1111", payload, keys, recips)
        await conn.execute("SELECT pg_notify('outbox', '')")  # as a front end wakes the senders
    unsent = n
    while unsent:
        await asyncio.sleep(0.01)
        unsent = await pool.fetchval(q("lt_outbox_unsent"))
    elapsed = time.perf_counter() - started
    cores = meter.shares()
    accepted = await pool.fetchval(
        "SELECT count(*) FROM outbox WHERE tenant = $1 AND state = 'accepted'", tag
    )
    if accepted != n:
        raise RuntimeError(f"saturation round {tag}: {accepted} of {n} accepted")
    return Saturation(n / elapsed, elapsed, cores)


def _request(path: str, token: str, i: int) -> bytes:
    """POST ``path`` with Meta's body of a text to its own recipient, as bytes on the wire."""
    body = orjson.dumps({"messaging_product": "whatsapp", "recipient_type": "individual",
                         "to": f"49153{i:08d}", "type": "text", "text": {"body": f"graph {i}"}})  # fmt: skip
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")  # fmt: skip
    return head.encode() + body


GRAPH = ("/v23.0/1111/messages", API_KEY)  # the gateway's path and key
DIRECT = ("/v21.0/1111/messages", "bench")  # the fake provider's


@dataclass(slots=True)
class Phase:
    """One open-model phase: latencies (ms from each request's scheduled start), what was
    wrong with the answers that were not 200 with a wamid, and how fast answers came."""

    rate: float
    latencies: list[float] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0
    cores: dict[str, float] = field(default_factory=dict)
    statements: list[dict[str, Any]] = field(default_factory=list)
    parts: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def answered_per_s(self) -> float:
        return len(self.latencies) / self.elapsed_s if self.elapsed_s else 0.0

    def summary(self) -> dict[str, float]:
        return _summary(self.latencies)

    def figures(self) -> dict[str, Any]:
        """What the result keeps of the phase (not every latency)."""
        return {
            "rate": self.rate,
            "answered_per_s": self.answered_per_s,
            "ms": self.summary(),
            "wrong": len(self.wrong),
            "cores": self.cores,
            "statements": self.statements,
            "parts": self.parts,
        }


async def _open_model(http: Pool, to: tuple[str, str], rate: float, seconds: float, first: int) -> Phase:
    """Requests at ``rate`` per second for ``seconds`` (built before the clock starts), on the
    harness's lean client: the generator shares the machine's cores with what it measures."""
    out = Phase(rate)
    n = max(1, int(rate * seconds))
    wires = [_request(*to, first + i) for i in range(n)]

    async def one(i: int, intended: float) -> None:
        try:
            status, raw = await http.exchange(wires[i])
            ok = status == 200 and str(orjson.loads(raw)["messages"][0]["id"]).startswith("wamid.")
            if not ok:
                out.wrong.append(f"HTTP {status}: {raw[:120]!r}")
        except (HttpError, ValueError, KeyError, IndexError, TypeError) as exc:
            out.wrong.append(f"{type(exc).__name__}: {exc}")
        out.latencies.append((time.perf_counter() - intended) * 1000)

    tasks = []
    start = time.perf_counter() + 0.05
    for i in range(n):
        intended = start + i / rate
        delay = intended - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(i, intended)))
    await asyncio.gather(*tasks)
    # The schedule's length, or longer when the answers fell behind it.
    out.elapsed_s = max(n / rate, time.perf_counter() - start)
    return out


async def _where_time_went(pool: asyncpg.Pool, since: float) -> dict[str, dict[str, float]]:
    """Per Graph-compatible row created after ``since``: commit -> claimed by the sender,
    claimed -> accepted recorded."""
    rows = await pool.fetch(
        "SELECT extract(epoch FROM sending_at - created_at) * 1000 AS queued,"
        "       extract(epoch FROM accepted_at - sending_at) * 1000 AS sent "
        "FROM outbox WHERE idem_key LIKE 'graph.%' AND accepted_at IS NOT NULL"
        "  AND created_at >= to_timestamp($1)",
        since,
    )
    return {name: _summary([float(r[name]) for r in rows]) for name in ("queued", "sent") if rows}


def _summary(latencies: list[float]) -> dict[str, float]:
    if not latencies:
        return {"p50": float("nan"), "p99": float("nan"), "max": float("nan")}
    return {"p50": percentile(latencies, 50), "p99": percentile(latencies, 99), "max": max(latencies)}


# ---- what each process used ----------------------------------------------------------------
async def _postgres_pids(pool: asyncpg.Pool) -> list[int]:
    """This database's backends and the server's own processes, where they run on this machine."""
    rows = await pool.fetch(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() OR datname IS NULL"
    )
    return [r["pid"] for r in rows if psutil.pid_exists(r["pid"])]


def _role(pid: int) -> str:
    try:
        cmd = psutil.Process(pid).cmdline()
    except psutil.Error:
        return "gateway"
    return next((f"gateway {f[2:]}" for f in ("--worker", "--services") if f in cmd), "gateway")


async def _meter(pool: asyncpg.Pool, gw: Gateway) -> CpuMeter:
    pg = await _postgres_pids(pool)  # asked once: the pool's backends stay for the phase

    def groups() -> dict[str, list[int]]:
        out: dict[str, list[int]] = {
            "postgres": pg,
            "fake provider": [gw.fake_pid],
            "generator": [os.getpid()],
        }
        for pid in tree(gw.serve_pid):
            out.setdefault(_role(pid), []).append(pid)
        return out

    return CpuMeter(gw.serve_pid, None, groups=groups)


# ---- pg_stat_statements, where the server loads it -------------------------------------------
async def _statements_on(pool: asyncpg.Pool) -> bool:
    try:
        await pool.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        await pool.execute("SELECT pg_stat_statements_reset()")
    except asyncpg.PostgresError:
        return False
    return True


async def _statements(pool: asyncpg.Pool, requests: int) -> list[dict[str, Any]]:
    """The statements that cost this database most since the reset, per request."""
    rows = await pool.fetch(
        "SELECT calls, total_exec_time, regexp_replace(query, '\\s+', ' ', 'g') AS query"
        " FROM pg_stat_statements"
        " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
        "  AND query NOT LIKE '%pg_stat_statements%' ORDER BY total_exec_time DESC LIMIT 8"
    )
    return [
        {
            "query": r["query"][:90],
            "calls_per_request": r["calls"] / max(requests, 1),
            "us_per_call": r["total_exec_time"] * 1000 / max(r["calls"], 1),
            "us_per_request": r["total_exec_time"] * 1000 / max(requests, 1),
        }
        for r in rows
    ]


async def _measured_phase(
    http: Pool, gw: Gateway, pool: asyncpg.Pool, rate: float, seconds: float, first: int
) -> Phase:
    statements = await _statements_on(pool)
    since = time.time() - 1.0  # the database clock may be a little behind this one
    meter = await _meter(pool, gw)
    meter.start()
    phase = await _open_model(http, GRAPH, rate, seconds, first)
    phase.cores = meter.shares()
    if statements:
        phase.statements = await _statements(pool, len(phase.latencies))
    phase.parts = await _where_time_went(pool, since)
    return phase


# ---- the verdict -------------------------------------------------------------------------------
def verdict(phases: dict[str, Phase], saturation: float, asked_rate: float = 0.0) -> Verdict:
    """The targets: p99 at each share of the saturation, the answers keeping pace, every answer
    Meta's 200 with a wamid. A run at ``asked_rate`` judges only its answers."""
    v = Verdict()
    for name, phase in phases.items():
        if not asked_rate:
            p99 = phase.summary()["p99"]
            kept = phase.answered_per_s / (saturation * SHARES[name]) * 100
            where = f"{name} of the sender's saturation ({phase.rate:.0f}/s)"
            v.targets.append(Target(f"p99 at {where}", p99, TARGET_P99_MS, "<=", " ms"))
            v.targets.append(
                Target(f"answered at {where}", kept, MIN_RATE_SHARE * 100, ">=", " % of the schedule")
            )
        if phase.wrong:
            v.failed_checks.append(f"at {phase.rate:.0f}/s {len(phase.wrong)} answers not 200 with a wamid")
    if asked_rate:
        v.notes.append(
            f"run at {asked_rate:.0f}/s, not at shares of the sender's saturation ({saturation:.0f}/s): "
            "the latency targets are not judged"
        )
    return v


def _cores(cores: dict[str, float], wall_s: float, n: int, per: str) -> str:
    """The cores each process used, and its CPU per ``per``."""
    used = ", ".join(
        f"{k} {c:.2f} ({c * wall_s / max(n, 1) * 1e6:.0f} µs/{per})"
        for k, c in cores.items()
        if k not in ("machine", "steal")
    )
    return (
        f"  cores: {used}; the machine {cores.get('machine', 0.0):.2f}, steal {cores.get('steal', 0.0):.2f}"
    )


def _text(
    rounds: list[Saturation], messages: int, phases: dict[str, Phase], base: Phase, seconds: float
) -> str:
    lines = [machine()]
    best = max(rounds, key=lambda r: r.rate)
    rates = ", ".join(f"{r.rate:.0f}" for r in rounds)
    lines.append(f"sender saturation: {rates} sends/s (best {best.rate:.0f})")
    lines.append(_cores(best.cores, best.elapsed_s, messages, "send"))
    for name, ph in phases.items():
        g = ph.summary()
        lines.append(
            f"graph-compatible sends at {ph.rate:.0f}/s ({name}) for {seconds:.0f} s ({len(ph.latencies)} "
            f"requests, answered {ph.answered_per_s:.0f}/s): p50 {g['p50']:.1f} ms, p99 {g['p99']:.1f} ms, "
            f"max {g['max']:.1f} ms; {len(ph.wrong)} not answered 200 with a wamid"
        )
        for part, what in (("queued", "commit -> claimed by the sender"), ("sent", "claimed -> accepted")):
            x = ph.parts.get(part)
            if x:
                lines.append(f"  {what}: p50 {x['p50']:.1f} ms, p99 {x['p99']:.1f} ms")
        lines.append(_cores(ph.cores, ph.elapsed_s, len(ph.latencies), "request"))
        for s in ph.statements:
            lines.append(f"  sql {s['calls_per_request']:.3f}/request x {s['us_per_call']:.0f} µs = "
                  f"{s['us_per_request']:.1f} µs/request: {s['query']}")  # fmt: skip
        for w in ph.wrong[:5]:
            lines.append(f"  {w}")
    b = base.summary()
    lines.append(
        f"baseline, the same bodies straight to the fake provider at {base.rate:.0f}/s: "
        f"p50 {b['p50']:.1f} ms, p99 {b['p99']:.1f} ms, max {b['max']:.1f} ms ({len(base.wrong)} wrong)"
    )
    return "\n".join(lines)


async def _run(dsn: str, args: argparse.Namespace, run: contract.Run) -> int:
    async with _running(dsn, run.log_dir, args.services) as gw:
        pool = await create_pool(dsn, 1, 4)
        try:
            rounds = [await _saturation(pool, gw, args.messages, f"sat{r}") for r in range(2)]
            saturation = max(r.rate for r in rounds)
            rates = {f"{args.rate:.0f}/s": args.rate} if args.rate else {
                name: saturation * share for name, share in SHARES.items()
            }  # fmt: skip
            http = Pool("127.0.0.1", gw.port, args.concurrency, timeout_s=30)
            fake = Pool("127.0.0.1", gw.fake_port, args.concurrency, timeout_s=30)
            try:
                await http.prewarm(min(args.concurrency, 64))
                await _open_model(http, GRAPH, min(min(rates.values()), 50.0), 1.0, 10_000_000)  # warm-up
                phases: dict[str, Phase] = {}
                for i, (name, rate) in enumerate(rates.items()):
                    phases[name] = await _measured_phase(
                        http, gw, pool, rate, args.seconds, i * 1_000_000
                    )
                await fake.prewarm(min(args.concurrency, 64))
                base = await _open_model(fake, DIRECT, max(rates.values()), args.seconds, 20_000_000)
            finally:
                http.close()
                fake.close()
        finally:
            await pool.close()
    text = _text(rounds, args.messages, phases, base, args.seconds)
    figures = {
        "saturation": [asdict(r) for r in rounds],
        "phases": {name: ph.figures() for name, ph in phases.items()},
        "direct": base.figures(),
    }
    return run.finish(figures, text, verdict=verdict(phases, saturation, args.rate))


async def main(args: argparse.Namespace) -> int:
    run = contract.Run(args)
    with database.server("bench-graph") as (admin_dsn, _embedded):
        async with scratch_database(admin_dsn, "bench_graph") as dsn:
            return await _run(dsn, args, run)
