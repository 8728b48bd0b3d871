"""``python -m loadtest bench-ingest``: the gateway against two baselines, side by side, in one run.

* ``bare``   verifies the signature and answers 200: nothing stored (the ceiling);
* ``insert`` verifies, then one INSERT + COMMIT per request (the naive durable handler);
* ``gateway`` the real ``gateway serve`` (group commit), consumers off.

Each runs as its own process (aiohttp, uvloop, access log off) on the same embedded
PostgreSQL, driven by the same generator with the same pre-built, pre-signed payloads.
First the saturation throughput of each (closed loop, ``--concurrency`` workers, rounds
interleaved so machine noise hits all three alike), then the open-model latency of each at
half of the gateway's saturation rate. Ratios are printed against the DESIGN.md targets.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from gateway.db import connect
from loadtest import driver, plan, processes, report
from loadtest.httpclient import Pool
from loadtest.payloads import PayloadFactory
from loadtest.run import add_common_args
from loadtest.scenarios import SCENARIOS, scenario
from loadtest.schedule import arrivals, constant

TARGET_VS_BARE = 0.85
TARGET_VS_INSERT = 3.5
TARGET_P99_MS = 25.0
TARGET_P50_MS = 5.0
SERVERS = ("bare", "insert", "gateway")


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--duration", type=float, default=6.0, help="seconds per saturation measurement")
    p.add_argument("--rounds", type=int, default=2, help="saturation rounds (interleaved; median kept)")
    p.add_argument("--concurrency", type=int, default=64, help="closed-loop workers when saturating")
    p.add_argument(
        "--half-duration", type=float, default=15.0, help="seconds of open-model load at half rate"
    )
    p.add_argument("--scenario", default="mixed", choices=sorted(SCENARIOS))
    p.add_argument("--payloads", type=int, default=20000, help="distinct pre-signed bodies for saturation")
    p.add_argument("--pool-max", type=int, default=10, help="DB pool size of the gateway and insert server")
    p.add_argument("--gateway-env", action="append", default=[], metavar="K=V", help="extra gateway env")
    p.add_argument("--name", default="bench-ingest")
    add_common_args(p)


class CpuMeter:
    """CPU seconds used by a set of processes (a server, PostgreSQL) over a phase."""

    def __init__(self, pids: dict[str, list[int]]) -> None:
        self.procs = {k: [psutil.Process(p) for p in v] for k, v in pids.items()}
        self.t0 = 0.0
        self.c0: dict[str, float] = {}

    def _cpu(self) -> dict[str, float]:
        out = {}
        for k, ps in self.procs.items():
            total = 0.0
            for p in ps:
                with contextlib.suppress(psutil.Error):
                    t = p.cpu_times()
                    total += t.user + t.system
            out[k] = total
        return out

    def start(self) -> None:
        self.t0, self.c0 = time.monotonic(), self._cpu()

    def shares(self) -> dict[str, float]:
        wall = time.monotonic() - self.t0
        return {k: round((v - self.c0[k]) / wall, 2) for k, v in self._cpu().items()}


def postgres_pids(server: Any) -> list[int]:
    """The postmaster and its backends (the benchmark's database load)."""
    try:
        root = psutil.Process(int(server.get_pid()))
    except Exception:
        return []
    return [root.pid] + [c.pid for c in root.children(recursive=True)]


async def truncate(dsn: str) -> None:
    conn = await connect(dsn)
    try:
        await conn.execute("TRUNCATE webhook_inbox")  # benchmark-only reset between phases
        await conn.execute("CHECKPOINT")
    finally:
        await conn.close()


async def main(ns: argparse.Namespace) -> int:
    ns.results.mkdir(parents=True, exist_ok=True)
    stem = f"{ns.name}-{dt.datetime.now().strftime('%Y%m%d-%H%M%S')}"
    log_dir = ns.results / f"{stem}-logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    secrets = processes.DEFAULT_SECRETS
    tmp = Path(tempfile.mkdtemp(prefix="bench-ingest-"))
    server = None
    procs: dict[str, processes.Proc] = {}
    try:
        dsn = ns.database_url
        if not dsn:
            server, dsn = processes.start_database(tmp)
        await processes.migrate(dsn)
        extra = dict(kv.split("=", 1) for kv in ns.gateway_env)
        extra.setdefault("GATEWAY_DB_POOL_MAX", str(ns.pool_max))
        procs["bare"] = processes.start_baseline("bare", dsn, secrets, log_dir, ns.pool_max)
        procs["insert"] = processes.start_baseline("insert", dsn, secrets, log_dir, ns.pool_max)
        procs["gateway"] = processes.start_gateway(dsn, secrets, log_dir, consumers=False, extra=extra)
        for p in procs.values():
            await p.wait_ready()
        result = await bench(ns, dsn, procs, server)
    finally:
        for p in procs.values():
            p.stop()
        if server is not None:
            with contextlib.suppress(Exception):
                server.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)
    text = bench_table(result)
    print(text)
    charts = [
        report.svg_chart(
            f"{name}: ack latency per second at {result['half_rate']:.0f}/s",
            [(k[:-3], report._series(r["timeline"], "t", k)) for k in ("p50_ms", "p99_ms", "max_ms")],
            "ms",
        )
        for name, r in result["half"].items()
    ]
    jpath, hpath = report.write(ns.results, stem, result, text, charts)
    print(f"\nresults: {jpath}\n         {hpath}")
    return 0


async def bench(
    ns: argparse.Namespace, dsn: str, procs: dict[str, processes.Proc], server: Any
) -> dict[str, Any]:
    factory = PayloadFactory(processes.DEFAULT_SECRETS, ns.seed, run_tag=f"b{int(time.time()):x}")
    scen = scenario(ns.scenario, factory)
    sys.stderr.write(f"pre-building {ns.payloads} signed payloads...\n")
    wires = [(d.wire, d.signed_ok) for d in (scen.next() for _ in range(ns.payloads))]
    mean_body = statistics.fmean(len(w) for w, _ in wires)
    pg = postgres_pids(server) if server is not None else []
    sat: dict[str, list[float]] = {k: [] for k in SERVERS}
    cpu: dict[str, list[dict[str, float]]] = {k: [] for k in SERVERS}
    gen_cpu: dict[str, list[float]] = {k: [] for k in SERVERS}
    outcomes: dict[str, dict[str, int]] = {}
    for rnd in range(ns.rounds):
        for name in SERVERS:
            await truncate(dsn)
            proc = procs[name]
            meter = CpuMeter({"server": [proc.pid], "postgres": pg})
            pool = Pool("127.0.0.1", proc.port, ns.concurrency, ns.timeout)
            meter.start()
            r = await driver.run_closed(wires, pool, concurrency=ns.concurrency, duration_s=ns.duration)
            pool.close()
            cpu[name].append(meter.shares())
            sat[name].append(r.throughput)
            gen_cpu[name].append(r.generator_cpu)
            outcomes[name] = r.outcomes
            sys.stderr.write(
                f"round {rnd + 1} {name:8s} saturation {r.throughput:8.0f}/s  outcomes {r.outcomes}  "
                f"cpu {cpu[name][-1]}  generator {r.generator_cpu:.2f}\n"
            )
    saturation = {k: statistics.median(v) for k, v in sat.items()}
    half_rate = saturation["gateway"] / 2
    half: dict[str, Any] = {}
    for name in SERVERS:
        await truncate(dsn)
        proc = procs[name]
        duration = ns.half_duration
        if saturation[name] < half_rate:
            # Past its saturation the queue only grows: a short run shows it without a long wait.
            duration = min(duration, 5.0)
        factory2 = PayloadFactory(
            processes.DEFAULT_SECRETS, ns.seed + 1, run_tag=f"h{name}{int(time.time()):x}"
        )
        profile = constant(half_rate, duration)
        shots = list(
            plan.build(arrivals(profile), scenario(ns.scenario, factory2), factory2, plan.NO_DUPLICATES)
        )
        pool = Pool("127.0.0.1", proc.port, ns.connections, ns.timeout)
        meter = CpuMeter({"server": [proc.pid], "postgres": pg})
        meter.start()
        res = await driver.run_open(
            shots, pool, duration_s=duration, progress=not ns.quiet, label=f"{name:8s}"
        )
        pool.close()
        row = driver.summary_row(res)
        row["cpu"] = meter.shares()
        row["timeline"] = res.recorder.timeline()
        row["warnings"] = res.warnings
        row["duration_s"] = duration
        half[name] = row
    g = saturation["gateway"]
    ratios = {
        "gateway_vs_bare": g / saturation["bare"] if saturation["bare"] else 0.0,
        "gateway_vs_insert": g / saturation["insert"] if saturation["insert"] else 0.0,
    }
    gack = half["gateway"]["ack_ms"]
    return {
        "parameters": {k: str(v) if isinstance(v, Path) else v for k, v in vars(ns).items() if k != "func"},
        "mean_request_bytes": round(mean_body),
        "saturation_rounds": sat,
        "saturation": saturation,
        "saturation_cpu": cpu,
        "saturation_generator_cpu": gen_cpu,
        "saturation_outcomes": outcomes,
        "half_rate": half_rate,
        "half": half,
        "ratios": ratios,
        "targets": {
            "gateway_vs_bare": {
                "target": TARGET_VS_BARE,
                "value": ratios["gateway_vs_bare"],
                "met": ratios["gateway_vs_bare"] >= TARGET_VS_BARE,
            },
            "gateway_vs_insert": {
                "target": TARGET_VS_INSERT,
                "value": ratios["gateway_vs_insert"],
                "met": ratios["gateway_vs_insert"] >= TARGET_VS_INSERT,
            },
            "p99_ms_at_half": {
                "target": TARGET_P99_MS,
                "value": gack.get("p99"),
                "met": gack.get("p99", 1e9) <= TARGET_P99_MS,
            },
            "p50_ms_at_half": {
                "target": TARGET_P50_MS,
                "value": gack.get("p50"),
                "met": gack.get("p50", 1e9) <= TARGET_P50_MS,
            },
        },
    }


def bench_table(r: dict[str, Any]) -> str:
    rows = []
    for name in SERVERS:
        h = r["half"][name]
        ack = h["ack_ms"]
        gen = statistics.fmean(r["saturation_generator_cpu"][name])
        rows.append(
            (
                name,
                f"{r['saturation'][name]:.0f}",
                " / ".join(f"{x:.0f}" for x in r["saturation_rounds"][name]),
                f"{gen * 100:.0f}%",
                f"{h['rate_reached']:.0f}",
                *(report.fmt_ms(ack.get(k)) for k in ("p50", "p90", "p99", "p99.9", "max")),
                ", ".join(f"{k}={v}" for k, v in h["errors"].items()) or "-",
            )
        )
    out = table_head(r) + report.table(
        (
            "server",
            "sat/s",
            "rounds",
            "gen cpu",
            "half rate/s",
            "p50 ms",
            "p90",
            "p99",
            "p99.9",
            "max",
            "errors",
        ),
        rows,
    )
    out += "\n\n" + report.table(
        ("target", "value", "goal", "met"),
        [
            (
                "gateway / bare throughput",
                f"{r['ratios']['gateway_vs_bare']:.2f}",
                f">= {TARGET_VS_BARE}",
                _yes(r["targets"]["gateway_vs_bare"]["met"]),
            ),
            (
                "gateway / insert-per-request",
                f"{r['ratios']['gateway_vs_insert']:.2f}x",
                f">= {TARGET_VS_INSERT}x",
                _yes(r["targets"]["gateway_vs_insert"]["met"]),
            ),
            (
                "gateway p99 ack at half load",
                f"{report.fmt_ms(r['targets']['p99_ms_at_half']['value'])} ms",
                f"<= {TARGET_P99_MS} ms",
                _yes(r["targets"]["p99_ms_at_half"]["met"]),
            ),
            (
                "gateway p50 ack at half load",
                f"{report.fmt_ms(r['targets']['p50_ms_at_half']['value'])} ms",
                f"<= {TARGET_P50_MS} ms",
                _yes(r["targets"]["p50_ms_at_half"]["met"]),
            ),
        ],
    )
    for name in SERVERS:
        for w in r["half"][name]["warnings"]:
            out += f"\nWARNING ({name}): {w}"
    return out


def table_head(r: dict[str, Any]) -> str:
    p = r["parameters"]
    return (
        f"ingest benchmark: scenario {p['scenario']}, mean request {r['mean_request_bytes']} bytes, "
        f"closed loop {p['concurrency']} workers x {p['duration']}s x {p['rounds']} rounds, "
        f"then {r['half_rate']:.0f}/s open model (half the gateway's saturation)\n\n"
    )


def _yes(b: bool) -> str:
    return "yes" if b else "NO"
