"""``python -m loadtest bench-ingest``: the gateway against baselines, side by side, in one run.

* ``bare``   verifies the signature and answers 200: nothing stored (the ceiling);
* ``insert`` verifies, then one INSERT + COMMIT per request (the naive durable handler);
* ``gateway`` the real ``gateway serve`` (group commit), one process, no background services.

Each runs as its own process (aiohttp, uvloop, access log off) on the same embedded
PostgreSQL. Phases (``--phases``):

* ``saturation``: the saturation throughput of each, driven by the project's generator with
  the same pre-built, pre-signed payloads (closed loop, the best of the ``--concurrency``
  client counts, since a server that answers after a commit needs more requests in flight to
  fill its batches; rounds interleaved so machine noise hits all three alike; ``--pin`` puts
  the servers on CPU 0 and the generator and PostgreSQL on the rest);
* ``half``: the open-model latency of each at half of the gateway's saturation rate;
* ``fixed``: ``wrk -t1 -cN`` (Debian's package) for each ``--fixed`` connection count against
  ``bare``, ``edge`` (the gateway, one process, nothing else) and ``serve`` (``gateway serve``
  as a user runs it, consumers, sender and forwarder on, which must keep up: see
  loadtest.harness.fixed).

Ratios are taken within each round, the median of the rounds judged; a missed target exits 1.
The fixed phase also judges serve's CPU per webhook (its processes and PostgreSQL, until its
consumers drained the run) against the bare handler's CPU per request: <= 3x.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from gateway.store.db import connect
from loadtest.harness import contract, driver, fixed, plan, processes, wrk
from loadtest.harness.cpu import CpuMeter, postgres_pids
from loadtest.harness.httpclient import Pool
from loadtest.harness.ingest_report import (
    SERVERS,
    TARGET_P50_MS,
    TARGET_P99_MS,
    TARGET_VS_BARE,
    TARGET_VS_INSERT,
    bench_charts,
    bench_table,
    bench_verdict,
)
from loadtest.harness.options import add_common_args
from loadtest.harness.payloads import PayloadFactory
from loadtest.harness.scenarios import SCENARIOS, scenario
from loadtest.harness.schedule import arrivals, constant

HELP = "gateway (edge, default serve) vs bare verify-only vs insert-per-request handler"
PHASES = ("saturation", "half", "fixed")


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--duration", type=float, default=6.0, help="seconds per saturation measurement")
    p.add_argument("--rounds", type=int, default=3, help="saturation rounds (interleaved; median kept)")
    p.add_argument(
        "--concurrency",
        default="32,256",
        help="closed-loop client counts tried when saturating (comma-separated; the best counts)",
    )
    p.add_argument("--half-duration", type=float, default=10.0, help="seconds of open load at half rate")
    p.add_argument("--half-rounds", type=int, default=3, help="half-load rounds (interleaved; median kept)")
    p.add_argument("--scenario", default="mixed", choices=sorted(SCENARIOS))
    p.add_argument("--payloads", type=int, default=20000, help="distinct pre-signed bodies for saturation")
    p.add_argument("--pool-max", type=int, default=10, help="DB pool size of the gateway and insert server")
    p.add_argument("--gateway-env", action="append", default=[], metavar="K=V", help="extra gateway env")
    p.add_argument(
        "--pin", action="store_true", help="servers on CPU 0, generator and PostgreSQL on the rest"
    )
    p.add_argument(
        "--phases", default=",".join(PHASES), help=f"comma-separated, of {', '.join(PHASES)} (default: all)"
    )
    p.add_argument("--fixed", default="64,256", help="wrk connection counts of the fixed phase")
    p.add_argument("--fixed-duration", type=float, default=6.0, help="seconds per wrk run")
    p.add_argument("--fixed-requests", type=int, default=200000, help="distinct requests per wrk file")
    p.add_argument("--fixed-scenario", default="meta-status", choices=sorted(SCENARIOS))
    p.add_argument("--serve-env", action="append", default=[], metavar="K=V", help="extra env of serve")
    p.add_argument("--name", default="bench-ingest")
    add_common_args(p)


ALL_CPUS = sorted(os.sched_getaffinity(0))


def pin(ns: argparse.Namespace, server_pid: int, pg: Any, *, release: bool = False) -> None:
    """``--pin`` (saturation only): each server alone on CPU 0; the generator and PostgreSQL
    on the others, so a server's throughput is its own and not a share of a core it fights
    the generator for. ``release`` gives every process all CPUs back (for the latency phase)."""
    if not ns.pin or len(ALL_CPUS) < 2:
        return
    release = release or not getattr(ns, "pin_phase", True)  # a server restarted later
    everything = set(ALL_CPUS)
    rest = everything if release else set(ALL_CPUS[1:])
    with contextlib.suppress(OSError):
        os.sched_setaffinity(server_pid, everything if release else {ALL_CPUS[0]})
    os.sched_setaffinity(0, rest)
    for pid in postgres_pids(pg):
        with contextlib.suppress(OSError):
            os.sched_setaffinity(pid, rest)  # backends forked later inherit the postmaster's


async def truncate(dsn: str) -> None:
    conn = await connect(dsn)
    try:
        await conn.execute("TRUNCATE webhook_inbox")  # benchmark-only reset between phases
        await conn.execute("CHECKPOINT")
    finally:
        await conn.close()


async def main(ns: argparse.Namespace) -> int:
    phases = {x.strip() for x in ns.phases.split(",") if x.strip()}
    if unknown := phases - set(PHASES):
        print(f"unknown phase(s): {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    ns.phase_set = phases
    ns.wrk = wrk.path()
    if "fixed" in phases and ns.wrk is None:
        print(wrk.INSTALL, file=sys.stderr)
        return 2
    run = contract.Run(ns)
    log_dir = run.log_dir
    secrets = processes.DEFAULT_SECRETS
    tmp = Path(tempfile.mkdtemp(prefix="bench-ingest-"))
    server = None
    procs: dict[str, processes.Proc] = {}
    restarts: list[str] = []
    try:
        dsn = ns.database_url
        if not dsn:
            server, dsn = processes.start_database(tmp)
        await processes.migrate(dsn)
        extra = dict(kv.split("=", 1) for kv in ns.gateway_env)
        extra.setdefault("GATEWAY_DB_POOL_MAX", str(ns.pool_max))
        extra.setdefault("GATEWAY_RUN_FORWARDER", "false")  # nothing but the edge
        serve_extra = dict(kv.split("=", 1) for kv in ns.serve_env)
        # serve's consumers would otherwise take the rows the edge and insert servers store,
        # and load the machine while those are measured: serve gets a database of its own.
        serve_dsn = await processes.sibling_database(dsn, "bench_serve") if "fixed" in phases else dsn
        starters: dict[str, Callable[[], processes.Proc]] = {
            "bare": lambda: processes.start_baseline("bare", dsn, secrets, log_dir, ns.pool_max),
            "insert": lambda: processes.start_baseline("insert", dsn, secrets, log_dir, ns.pool_max),
            "gateway": lambda: processes.start_gateway(dsn, secrets, log_dir, consumers=False, extra=extra),
            "serve": lambda: processes.start_serve(serve_dsn, secrets, log_dir, extra=serve_extra),
        }
        starters["edge"] = starters["gateway"]
        wanted = set()
        if phases & {"saturation", "half"}:
            wanted |= set(SERVERS)
        if "fixed" in phases:
            wanted |= set(fixed.SERVERS)
        for name, start in starters.items():
            if name in wanted and name != "edge":
                procs[name] = start()
        if "edge" in wanted:
            procs["edge"] = procs["gateway"] if "gateway" in procs else starters["edge"]()
        for p in set(procs.values()):
            await p.wait_ready()
            if p.name != "serve":
                pin(ns, p.pid, server)

        async def ensure(name: str) -> processes.Proc:
            """A server that died (on this shared machine) is restarted, and that is reported."""
            if not procs[name].alive():
                rc = procs[name].stop()
                sys.stderr.write(f"{name} had exited (rc={rc}); restarting it\n")
                restarts.append(f"{name} exited with rc={rc} and was restarted")
                procs[name] = starters[name]()
                await procs[name].wait_ready()
                if name != "serve":
                    pin(ns, procs[name].pid, server)
            return procs[name]

        result: dict[str, Any] = {"load_average": list(os.getloadavg())}
        if phases & {"saturation", "half"}:
            result.update(await bench(ns, dsn, ensure, server))
        if "fixed" in phases:
            for p in set(procs.values()):  # wrk runs are not pinned
                pin(ns, p.pid, server, release=True)
            ns.pin_phase = False
            result["fixed"] = await fixed.phase(ns, {"serve": serve_dsn}, dsn, ensure, server, truncate)
            result.setdefault("parameters", contract.parameters(ns))
        result["load_average_after"] = list(os.getloadavg())
        result["restarts"] = restarts
    finally:
        for p in set(procs.values()):
            p.stop()
        if server is not None:
            with contextlib.suppress(Exception):
                server.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)
    return run.finish(result, bench_table(result), bench_charts(result), verdict=bench_verdict(result))


async def bench(
    ns: argparse.Namespace, dsn: str, ensure: Callable[[str], Awaitable[processes.Proc]], server: Any
) -> dict[str, Any]:
    factory = PayloadFactory(processes.DEFAULT_SECRETS, ns.seed, run_tag=f"b{int(time.time()):x}")
    scen = scenario(ns.scenario, factory)
    sys.stderr.write(f"pre-building {ns.payloads} signed payloads...\n")
    wires = [(d.wire, d.signed_ok) for d in (scen.next() for _ in range(ns.payloads))]
    mean_body = statistics.fmean(len(w) for w, _ in wires)
    sat: dict[str, list[float]] = {k: [] for k in SERVERS}
    cpu: dict[str, list[dict[str, float]]] = {k: [] for k in SERVERS}
    gen_cpu: dict[str, list[float]] = {k: [] for k in SERVERS}
    outcomes: dict[str, dict[str, int]] = {}
    levels = [int(x) for x in str(ns.concurrency).split(",")]
    # One unmeasured pass per server first: the first round ran ~25 % slower for the gateway
    # (connections of its commit pool opened on demand, heap growth), which is start-up, not
    # steady state.
    for name in SERVERS:
        proc = await ensure(name)
        pool = Pool("127.0.0.1", proc.port, max(levels), ns.timeout)
        await driver.run_closed(wires, pool, concurrency=max(levels), duration_s=2, warmup_s=0)
        pool.close()
    for rnd in range(ns.rounds):
        for name in SERVERS:
            best: tuple[driver.ClosedResult, dict[str, float], int] | None = None
            for clients in levels:
                await truncate(dsn)
                proc = await ensure(name)
                meter = CpuMeter(proc.pid, server)
                pool = Pool("127.0.0.1", proc.port, clients, ns.timeout)
                meter.start()
                r = await driver.run_closed(wires, pool, concurrency=clients, duration_s=ns.duration)
                pool.close()
                shares = meter.shares()
                sys.stderr.write(
                    f"round {rnd + 1} {name:8s} {clients:4d} clients {r.throughput:8.0f}/s  "
                    f"outcomes {r.outcomes}  cpu {shares}  generator {r.generator_cpu:.2f}\n"
                )
                if r.first_error:
                    sys.stderr.write(f"  first error: {r.first_error}; rc={proc.popen.returncode}\n")
                if best is None or r.throughput > best[0].throughput:
                    best = (r, shares, clients)
            assert best is not None
            sat[name].append(best[0].throughput)
            cpu[name].append({**best[1], "clients": best[2]})
            gen_cpu[name].append(best[0].generator_cpu)
            outcomes[name] = best[0].outcomes
    saturation = {k: statistics.median(v) for k, v in sat.items()}
    for name in SERVERS:
        pin(ns, (await ensure(name)).pid, server, release=True)
    ns.pin_phase = False
    # Noise from other work on the machine hits a whole round: compare within rounds.
    per_round = {
        "gateway_vs_bare": [g / b for g, b in zip(sat["gateway"], sat["bare"], strict=True) if b],
        "gateway_vs_insert": [g / i for g, i in zip(sat["gateway"], sat["insert"], strict=True) if i],
    }
    ratios = {k: statistics.median(v) if v else 0.0 for k, v in per_round.items()}
    half_rate = saturation["gateway"] / 2
    half_runs: dict[str, list[dict[str, Any]]] = {k: [] for k in SERVERS}
    for rnd in range(ns.half_rounds):
        for name in SERVERS:
            proc = await ensure(name)
            half_runs[name].append(await half_load(ns, dsn, proc, server, name, half_rate, saturation, rnd))
    half = {name: _median_run(runs) for name, runs in half_runs.items()}
    gack = half["gateway"]["ack_ms"]

    def target(value: float | None, goal: float, higher: bool) -> dict[str, Any]:
        met = value is not None and (value >= goal if higher else value <= goal)
        return {"target": goal, "value": value, "met": met}

    return {
        "parameters": contract.parameters(ns),
        "mean_request_bytes": round(mean_body),
        "saturation_rounds": sat,
        "saturation": saturation,
        "saturation_cpu": cpu,
        "saturation_generator_cpu": gen_cpu,
        "saturation_outcomes": outcomes,
        "ratio_rounds": per_round,
        "ratios": ratios,
        "half_rate": half_rate,
        "half_rounds": half_runs,
        "half": half,
        "targets": {
            "gateway_vs_bare": target(ratios["gateway_vs_bare"], TARGET_VS_BARE, True),
            "gateway_vs_insert": target(ratios["gateway_vs_insert"], TARGET_VS_INSERT, True),
            "p99_ms_at_half": target(gack.get("p99"), TARGET_P99_MS, False),
            "p50_ms_at_half": target(gack.get("p50"), TARGET_P50_MS, False),
        },
    }


async def half_load(
    ns: argparse.Namespace,
    dsn: str,
    proc: processes.Proc,
    server: Any,
    name: str,
    rate: float,
    saturation: dict[str, float],
    rnd: int,
) -> dict[str, Any]:
    """Open-model load at ``rate`` with fresh bodies; latency from each intended start."""
    await truncate(dsn)
    duration = ns.half_duration
    if saturation[name] < rate:
        # Past its saturation the queue only grows: a short run shows it without a long wait.
        duration = min(duration, 4.0)
    f = PayloadFactory(
        processes.DEFAULT_SECRETS, ns.seed + 1 + rnd, run_tag=f"h{name}{rnd}{int(time.time()):x}"
    )
    shots = list(
        plan.build(arrivals(constant(rate, duration)), scenario(ns.scenario, f), f, plan.NO_DUPLICATES)
    )
    pool = Pool("127.0.0.1", proc.port, ns.connections, ns.timeout)
    meter = CpuMeter(proc.pid, server)
    meter.start()
    res = await driver.run_open(shots, pool, duration_s=duration, progress=not ns.quiet, label=f"{name:8s}")
    pool.close()
    row = driver.summary_row(res)
    row["cpu"] = meter.shares()
    requests = max(1, row["answered"])
    wall = res.elapsed_s
    row["cpu_us_per_request"] = {
        k: round(v * wall / requests * 1e6, 1) for k, v in row["cpu"].items() if k not in ("machine", "steal")
    }
    row["timeline"] = res.recorder.timeline()
    row["warnings"] = res.warnings
    row["duration_s"] = duration
    return row


def _median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run whose p99 is the median one (its other figures come with it, consistent)."""
    ranked = sorted(runs, key=lambda r: r["ack_ms"].get("p99", float("inf")))
    return ranked[(len(ranked) - 1) // 2]
