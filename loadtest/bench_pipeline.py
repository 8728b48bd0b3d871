"""``python -m loadtest bench-pipeline``: Meta webhooks through ``gateway serve`` as a user runs it
to two downstream destinations, a Standard Webhooks one and a Meta-format one.

1. Ingest saturation of the default serve (its process layout by core count, consumers, sender
   and forwarder on, the destinations disabled): ``wrk -t1 -cN`` with events never sent
   before, the best of ``--conns`` (as in bench-ingest's fixed phase; the consumers must keep
   up). It bounds the search below.
2. The pipeline's saturation, the destinations enabled: the highest rate at which serve keeps
   up with both destinations (``loadtest.harness.sustain``: bisection over open-load probes of
   ``--probe-seconds``, each kept up when the work left undone at its end is at most a quarter
   of a second of its input). A rate above it only grows the backlog, so it is the rate the
   latency target is taken against.
3. Latency at half of that (or ``--rate``, which skips 1 and 2): one inbound message per
   webhook, open model (each POST at its intended time). Receipt -> downstream 2xx runs from a
   webhook's intended send time to the fake receiver processing its event (each receiver
   verifies every signature: ``standardwebhooks``, or ``X-Hub-Signature-256``). Target: p99
   <= 100 ms for each destination; every event processed once by each. Printed with it: the
   time per segment (``loadtest.harness.segments``) and the cores each process used.
4. ``--soak SECONDS``: the same load for that long (receivers counting only), the resident
   memory of every serve process sampled; target: flat (the last minute's peak within 10 %
   and 20 MB of the first minute's) and <= 150 MB per process; every delivery delivered.

Between 1 and 2, the cost (``--cost-rate``, both destinations): CPU per webhook of serve and
PostgreSQL against the bare relay's, round by round, after an unmeasured warm-up of each; the
two sides take turns going first, and the median of the rounds' ratios is judged; target <= 2x.
CPU is counted from /proc, that of processes which ended meanwhile (PostgreSQL backends,
autovacuum workers) included (``loadtest.harness.cpu``). ``--split`` adds the bare
handler and serve with the destinations disabled, so that receiving, storing and forwarding are
told apart.

Self-contained: an embedded PostgreSQL in a temporary directory, whatever ``--database-url``
or $DATABASE_URL say (it truncates tables and measures the server's CPU). Prints only what
it measured, the load average included; exits 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from gateway.core import stdwebhooks
from gateway.store import deliveries, inbox
from gateway.store.db import connect
from loadtest.harness import (
    contract,
    database,
    fixed,
    pgstat,
    pipeline_report,
    processes,
    segments,
    sustain,
    wrk,
)
from loadtest.harness.cpu import CpuMeter, postgres_pids, tree
from loadtest.harness.driver import run_open
from loadtest.harness.httpclient import Pool
from loadtest.harness.options import add_common_args
from loadtest.harness.payloads import PayloadFactory
from loadtest.harness.plan import NO_DUPLICATES, build
from loadtest.harness.receiver import Receivers
from loadtest.harness.scenarios import SCENARIOS, scenario
from loadtest.harness.schedule import arrivals, constant
from loadtest.harness.sql import queries
from loadtest.harness.stats import percentile

HELP = "webhooks through the default gateway serve to a Standard Webhooks and a Meta-format destination"
SQL = queries("forwarding.sql")
OPEN_CAP = 10_000_000  # counted exactly below it
DESTINATIONS = {"std": "standard", "meta": "meta"}
META_SECRET = "bench-pipeline-meta-app-secret"
# Short retries for a run of minutes (production defaults retry for hours); the receivers are
# on 127.0.0.1.
SERVE_ENV = {
    "GATEWAY_FORWARD_ALLOW_PRIVATE": "1",
    "GATEWAY_FORWARD_TIMEOUT_MS": "2000",
    "GATEWAY_FORWARD_RETRY_BASE_MS": "200",
    "GATEWAY_FORWARD_RETRY_MAX_MS": "2000",
}


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--conns", default="64,256", help="wrk connection counts for the saturation")
    p.add_argument("--fixed-duration", type=float, default=6.0, help="seconds per saturation run")
    p.add_argument("--fixed-requests", type=int, default=200000, help="distinct requests per wrk file")
    p.add_argument("--fixed-scenario", default="meta-status", choices=sorted(SCENARIOS))
    p.add_argument(
        "--rate", type=float, default=0.0, help="latency rate (0: half of the pipeline's saturation)"
    )
    p.add_argument("--probe-seconds", type=float, default=6.0, help="seconds per probe of the rate search")
    p.add_argument("--probe-min", type=float, default=50.0, help="lowest rate the search assumes kept up")
    p.add_argument(
        "--probe-tolerance", type=float, default=0.1, help="search done when its bounds are this close"
    )
    p.add_argument("--seconds", type=float, default=20.0, help="latency phase length")
    p.add_argument("--soak", type=float, default=0.0, help="seconds of soak after the latency phase")
    p.add_argument(
        "--rounds", type=int, default=5, help="rounds of the cost phase (the median ratio is judged)"
    )
    p.add_argument("--cost-rate", type=float, default=300.0, help="webhooks/s of the cost phase (0: skip it)")
    p.add_argument("--cost-seconds", type=float, default=12.0, help="seconds of each side of a cost round")
    p.add_argument(
        "--cost-warmup",
        type=float,
        default=5.0,
        help="unmeasured seconds of each side before the cost rounds",
    )
    p.add_argument(
        "--split",
        action="store_true",
        help="each cost round also measures the bare verify-only handler and serve with the "
        "destinations disabled, at the same rate: the cost of receiving, storing and forwarding",
    )
    p.add_argument("--serve-env", action="append", default=[], metavar="K=V", help="extra env of serve")
    p.add_argument(
        "--aged",
        action="store_true",
        help="first give every partitioned table the day partitions its default retention keeps",
    )
    p.add_argument("--name", default="bench-pipeline")
    add_common_args(p)


def receivers(log_dir: Path, max_s: float) -> Receivers:
    """A Standard Webhooks and a Meta-format fake receiver."""
    secrets = {"std": stdwebhooks.generate_secret(), "meta": META_SECRET}
    return Receivers(log_dir, max_s, DESTINATIONS, secrets)


async def _destinations(dsn: str, rx: Receivers, enabled: bool) -> None:
    conn = await connect(dsn)
    try:
        for name, fmt in DESTINATIONS.items():
            if await deliveries.get_destination(conn, name=name) is None:
                await deliveries.add_destination(
                    conn, name=name, url=rx.clients[name].hooks, events=["message", "status", "account"],
                    secret=rx.secrets[name], max_in_flight=256, ordered=False, format=fmt,
                )  # fmt: skip
            await deliveries.set_enabled(conn, name=name, enabled=enabled)
    finally:
        await conn.close()


async def _open_deliveries(dsn: str) -> dict[str, int]:
    conn = await connect(dsn)
    try:
        rows = await conn.fetch(SQL["fw_states"])
        return {r["state"]: r["n"] for r in rows}
    finally:
        await conn.close()


async def saturation(ns: argparse.Namespace, dsn: str, serve: processes.Proc, pg: Any) -> dict[str, Any]:
    async def ensure(name: str) -> processes.Proc:
        return serve

    async def truncate(dsn: str) -> None:
        conn = await connect(dsn)
        try:
            await conn.execute(SQL["fw_reset_inbox"])
        finally:
            await conn.close()

    levels = [int(x) for x in ns.conns.split(",") if x.strip()]
    with tempfile.TemporaryDirectory(prefix="bench-pipeline-") as tmp:
        reqs = fixed.Requests(ns, Path(tmp))
        runs = [await fixed.one(ns, dsn, ensure, pg, reqs, "serve", c, 0, truncate) for c in levels]
    best = max(runs, key=lambda r: r.rate)
    return {"runs": [dataclasses.asdict(r) for r in runs], "rate": best.rate, "connections": best.connections}


async def _open_work(dsn: str) -> tuple[int, int]:
    """(staged rows pending, deliveries not yet delivered), as the gateway's own gauges count
    them (its metrics: whatever its storage, the harness asks it the same way)."""
    conn = await connect(dsn)
    try:
        pending = await inbox.depth(conn, cap=OPEN_CAP)
        undelivered = sum(g.backlog for g in await deliveries.gauges(conn, cap=OPEN_CAP))
        return pending, undelivered
    finally:
        await conn.close()


async def _settle(dsn: str, timeout_s: float = 120.0) -> float | None:
    """Seconds until the pipeline has nothing left to do (None: not within ``timeout_s``)."""
    started = time.monotonic()
    while any(await _open_work(dsn)):
        if time.monotonic() - started > timeout_s:
            return None
        await asyncio.sleep(0.25)
    return round(time.monotonic() - started, 2)


async def probe(
    ns: argparse.Namespace, serve: processes.Proc, dsn: str, rate: float
) -> tuple[sustain.Probe, dict[str, Any]]:
    """``rate`` webhooks/s (one inbound message each) for ``--probe-seconds``; the work left
    undone when the load ended, in events (deliveries counted per destination), and what the
    table shows of it."""
    tag = f"r{rate:.0f}x{time.time_ns():x}"
    factory = PayloadFactory(processes.DEFAULT_SECRETS, ns.seed + 3, run_tag=tag)
    shots = build(
        arrivals(constant(rate, ns.probe_seconds)), scenario("meta-text", factory), factory, NO_DUPLICATES
    )
    pool = Pool("127.0.0.1", serve.port, ns.connections, ns.timeout)
    try:
        res = await run_open(shots, pool, duration_s=ns.probe_seconds, progress=False)
    finally:
        pool.close()
    pending, undelivered = await _open_work(dsn)
    errors = sum(res.recorder.errors().values())
    found = sustain.Probe(rate, pending + undelivered / len(DESTINATIONS), errors)
    settled = await _settle(dsn)
    sys.stderr.write(
        f"probe {rate:.0f}/s: {pending} staged and {undelivered} deliveries left at the end, "
        f"{'kept up' if found.kept_up() else 'fell behind'}; settled in {settled} s\n"
    )
    return found, {"pending": pending, "undelivered": undelivered, "settled_s": settled}


async def pipeline_saturation(
    ns: argparse.Namespace, serve: processes.Proc, dsn: str, ceiling: float
) -> dict[str, Any]:
    """The highest rate serve keeps up at with both destinations, below ``ceiling``."""
    search = sustain.Search(ns.probe_min, max(ceiling, ns.probe_min), tolerance=ns.probe_tolerance)
    probes = []
    while (rate := search.next_rate()) is not None:
        found, seen = await probe(ns, serve, dsn, rate)
        search.record(found)
        probes.append({**dataclasses.asdict(found), "kept_up": found.kept_up(search.slack_s), **seen})
    return {"rate": search.sustained, "low": search.lo, "high": search.hi, "probes": probes}


def _role(cmd: list[str]) -> str:
    """A process of serve's tree by what it runs: worker, services, forwarder or parent."""
    return next((f[2:] for f in ("--worker", "--services", "--forwarder") if f in cmd), "parent")


def _roles(serve: processes.Proc, pg: Any, rx: Receivers) -> dict[str, list[int]]:
    """The processes whose CPU a latency phase reports, by role (serve's children by flag)."""
    out: dict[str, list[int]] = {"postgres": postgres_pids(pg), "generator": [os.getpid()]}
    for p in tree(serve.pid):
        try:
            cmd = psutil.Process(p).cmdline()
        except psutil.Error:
            continue
        out.setdefault(_role(cmd), []).append(p)
    out["receivers"] = [r.pid for r in rx.procs.values()]
    return out


async def latency(
    ns: argparse.Namespace, rx: Receivers, serve: processes.Proc, rate: float, dsn: str, pg: Any
) -> dict[str, Any]:
    """One inbound message per webhook at ``rate``; receipt -> each receiver, per event, where
    the time went (``segments``) and the cores each process used meanwhile."""
    factory = PayloadFactory(processes.DEFAULT_SECRETS, ns.seed + 7, run_tag=f"p{int(time.time()):x}")
    shots = list(
        build(arrivals(constant(rate, ns.seconds)), scenario("meta-text", factory), factory, NO_DUPLICATES)
    )
    await rx.reset()
    pool = Pool("127.0.0.1", serve.port, ns.connections, ns.timeout)
    meter = CpuMeter(serve.pid, pg, groups=lambda: _roles(serve, pg, rx))
    meter.start()
    res = await run_open(shots, pool, duration_s=ns.seconds, progress=not ns.quiet, label="pipeline ")
    cores = meter.shares()
    pool.close()
    events = [(key, res.started_wall + shot.t) for shot in shots for key in shot.delivery.keys]
    out: dict[str, Any] = {
        "rate": rate, "webhooks": len(shots), "events": len(events), "destinations": {}, "cores": cores,
    }  # fmt: skip
    received: dict[str, dict[str, float]] = {}
    for name in DESTINATIONS:
        st = await rx.clients[name].wait(len(events), 60)
        ids = (await rx.clients[name].state(ids=True))["ids"]
        received[name] = ids
        lat = [
            (ids[wid] - sent) * 1000
            for key, sent in events
            if (wid := stdwebhooks.webhook_id(name, key)) in ids
        ]
        out["destinations"][name] = {
            "format": DESTINATIONS[name],
            "processed": st["processed"],
            "missing": len(events) - len(lat),
            "duplicates": st["duplicates"],
            "bad_signatures": st["bad_signatures"],
            "p50_ms": percentile(lat, 50),
            "p90_ms": percentile(lat, 90),
            "p99_ms": percentile(lat, 99),
            "max_ms": max(lat, default=float("nan")),
        }
    sent = dict(events)
    out["segments"] = segments.split(await segments.times(dsn, list(sent)), sent, received)
    out["acks"] = {"sent": res.recorder.sent, "errors": res.recorder.errors()}
    out["generator_warnings"] = res.warnings
    return out


def _rss(pid: int) -> dict[str, float]:
    """Resident MB of each process of serve's tree, by its role."""
    out: dict[str, float] = {}
    for p in tree(pid):
        try:
            proc = psutil.Process(p)
            cmd = proc.cmdline()
            out[f"{_role(cmd)} {p}"] = proc.memory_info().rss / 1e6
        except psutil.Error:
            continue
    return out


async def soak(ns: argparse.Namespace, rx: Receivers, serve: processes.Proc, rate: float) -> dict[str, Any]:
    await rx.reset(count_only=True)
    samples: list[dict[str, Any]] = []

    async def sampler() -> dict[str, float]:
        snap = _rss(serve.pid)
        samples.append({"t": time.monotonic(), **snap})
        return {"rss_mb": max(snap.values(), default=0.0)}

    factory = PayloadFactory(processes.DEFAULT_SECRETS, ns.seed + 11, run_tag=f"s{int(time.time()):x}")
    scen = scenario("meta-text", factory)
    pool = Pool("127.0.0.1", serve.port, ns.connections, ns.timeout)
    res = await run_open(
        build(arrivals(constant(rate, ns.soak)), scen, factory, NO_DUPLICATES),
        pool, duration_s=ns.soak, sampler=sampler, progress=not ns.quiet, label="soak ",
    )  # fmt: skip
    pool.close()
    t0 = samples[0]["t"] if samples else 0.0
    per_process: dict[str, list[tuple[float, float]]] = {}
    for s in samples:
        for k, v in s.items():
            if k != "t":
                per_process.setdefault(k, []).append((s["t"] - t0, v))
    return {"rate": rate, "seconds": ns.soak, "sent": res.recorder.sent, "errors": res.recorder.errors(),
            "rss": per_process}  # fmt: skip


def start_relay(rx: Receivers, log_dir: Path) -> processes.Proc:
    """The bare relay (loadtest.harness.servers): verify, POST to both receivers, answer."""
    return processes.start_baseline(
        "relay", "", processes.DEFAULT_SECRETS, log_dir, 0,
        ["--std-url", rx.clients["std"].hooks, "--std-secret", rx.secrets["std"],
         "--meta-url", rx.clients["meta"].hooks, "--meta-dest-secret", rx.secrets["meta"]],
    )  # fmt: skip


async def relay_saturation(ns: argparse.Namespace, relay: processes.Proc, rx: Receivers) -> dict[str, Any]:
    """The bare relay's throughput with wrk, the best of ``--conns`` (the receivers count only)."""
    await rx.reset(count_only=True)
    runs = []
    with tempfile.TemporaryDirectory(prefix="bench-pipeline-") as tmp:
        reqs = fixed.Requests(ns, Path(tmp))
        runner = wrk.Wrk(reqs.shared[0], ns.wrk)
        try:
            for c in [int(x) for x in ns.conns.split(",") if x.strip()]:
                r = await runner.run(relay.port, c, ns.fixed_duration)
                sys.stderr.write(f"relay -c{c}: {r.rate:.0f}/s, p99 {r.p99_ms:.1f} ms, non-2xx {r.non2xx}\n")
                runs.append({"connections": c, "rate": r.rate, "p99_ms": r.p99_ms, "non2xx": r.non2xx,
                             "errors": r.socket_errors})  # fmt: skip
        finally:
            runner.close()
    await rx.quiet()
    await rx.reset(count_only=False)
    return {"runs": runs, "rate": max((x["rate"] for x in runs), default=0.0)}


async def _drive(ns: argparse.Namespace, port: int, rate: float, seconds: float, tag: str) -> tuple[int, int]:
    """One inbound message per webhook at ``rate`` for ``seconds``; (webhooks, errors)."""
    factory = PayloadFactory(processes.DEFAULT_SECRETS, ns.seed + 13, run_tag=f"{tag}{time.time_ns():x}")
    shots = build(arrivals(constant(rate, seconds)), scenario("meta-text", factory), factory, NO_DUPLICATES)
    pool = Pool("127.0.0.1", port, ns.connections, ns.timeout)
    try:
        res = await run_open(shots, pool, duration_s=seconds, progress=False)
    finally:
        pool.close()
    return res.recorder.sent, sum(res.recorder.errors().values())


async def _serve_leg(
    ns: argparse.Namespace, tag: str, serve: processes.Proc, rx: Receivers, dsn: str, pg: Any, forwarded: bool
) -> dict[str, Any]:
    """serve at ``--cost-rate``: CPU per webhook of its processes and PostgreSQL, from the start
    of the load until every event was processed (``forwarded``: and reached both receivers,
    and its deliveries' outcomes were recorded)."""
    meter = CpuMeter(serve.pid, pg, groups=lambda: _roles(serve, pg, rx))
    meter.start()
    sent, errors = await _drive(ns, serve.port, ns.cost_rate, ns.cost_seconds, tag)
    missing = await rx.missing(sent) if forwarded else {}
    settled = await _settle(dsn)
    used = meter.used()
    roles = {k: v for k, v in used.items() if k not in ("postgres", "generator", "receivers")}
    serve_us = sum(roles.values()) / max(sent, 1) * 1e6
    pg_us = used.get("postgres", 0.0) / max(sent, 1) * 1e6
    return {
        "webhooks": sent, "errors": errors, "missing": missing, "settled_s": settled, "serve_us": serve_us,
        "postgres_us": pg_us, "us": serve_us + pg_us,
        "roles_us": {k: v / max(sent, 1) * 1e6 for k, v in roles.items()},
    }  # fmt: skip


async def _bare_leg(
    ns: argparse.Namespace, tag: str, proc: processes.Proc, rx: Receivers, forwarded: bool
) -> dict[str, Any]:
    """A baseline process at ``--cost-rate``: its CPU per webhook (``forwarded``: until its
    events reached both receivers, as the relay's do)."""
    meter = CpuMeter(proc.pid, None)
    meter.start()
    sent, errors = await _drive(ns, proc.port, ns.cost_rate, ns.cost_seconds, tag)
    missing = await rx.missing(sent) if forwarded else {}
    return {
        "webhooks": sent,
        "errors": errors,
        "missing": missing,
        "us": meter.used()["server"] / max(sent, 1) * 1e6,
    }


async def cost_round(
    ns: argparse.Namespace, rnd: int, serve: processes.Proc, relay: processes.Proc, rx: Receivers, dsn: str,
    pg: Any, statements: bool, bare: processes.Proc | None = None,
) -> dict[str, Any]:  # fmt: skip
    """The bare relay and serve (both destinations), each at ``--cost-rate``: the relay first in
    an even round, serve first in an odd one, so that a machine getting slower or faster over the
    phase weighs on both sides alike. With ``bare`` (``--split``) first the bare handler, and serve
    with the destinations disabled: what receiving, storing and forwarding each cost."""
    out: dict[str, Any] = {"round": rnd}
    if bare is not None:
        await rx.reset()
        out["bare"] = await _bare_leg(ns, f"cb{rnd}", bare, rx, forwarded=False)
        await _destinations(dsn, rx, enabled=False)
        out["alone"] = await _serve_leg(ns, f"ca{rnd}", serve, rx, dsn, pg, forwarded=False)
        await _destinations(dsn, rx, enabled=True)

    async def gateway() -> None:
        await rx.reset()
        if statements:
            await pgstat.reset(dsn)
        out["gateway"] = await _serve_leg(ns, f"cg{rnd}", serve, rx, dsn, pg, forwarded=True)
        if statements:
            out["statements"] = await pgstat.top(dsn)

    async def relayed() -> None:
        await rx.reset()
        out["relay"] = await _bare_leg(ns, f"cr{rnd}", relay, rx, forwarded=True)

    for leg in (relayed, gateway) if rnd % 2 == 0 else (gateway, relayed):
        await leg()
    out["ratio"] = out["gateway"]["us"] / out["relay"]["us"] if out["relay"]["us"] else float("nan")
    line = (
        f"cost round {rnd + 1}: relay {out['relay']['us']:.0f} us/webhook, serve + PostgreSQL "
        f"{out['gateway']['us']:.0f} us/webhook: {out['ratio']:.2f}x"
    )
    if bare is not None:
        line += f" (bare handler {out['bare']['us']:.0f}, serve alone {out['alone']['us']:.0f})"
    sys.stderr.write(line + "\n")
    return out


async def cost(
    ns: argparse.Namespace, serve: processes.Proc, relay: processes.Proc, rx: Receivers, dsn: str, pg: Any,
    bare: processes.Proc | None,
) -> dict[str, Any]:  # fmt: skip
    """``--rounds`` cost rounds after a warm-up of each side (``--cost-warmup`` seconds at the
    same rate, not measured: a process's first seconds of a load cost more than the rest, its
    connections, caches and the database's pages still filling)."""
    if ns.cost_warmup > 0:
        for port, tag in ((relay.port, "wr"), (serve.port, "wg")):
            await rx.reset()
            sent, _ = await _drive(ns, port, ns.cost_rate, ns.cost_warmup, tag)
            await rx.missing(sent)
        await _settle(dsn)
    rounds = []
    for rnd in range(ns.rounds):
        last = rnd == ns.rounds - 1
        rounds.append(await cost_round(ns, rnd, serve, relay, rx, dsn, pg, statements=last, bare=bare))
    statements = rounds[-1].pop("statements", None) if rounds else None
    return {
        "rate": ns.cost_rate, "seconds": ns.cost_seconds, "warmup": ns.cost_warmup, "rounds": rounds,
        "statements": statements,
    }  # fmt: skip


async def main(ns: argparse.Namespace) -> int:
    ns.wrk = wrk.path()
    if ns.wrk is None and not ns.rate:
        print(wrk.INSTALL, file=sys.stderr)
        return 2
    run = contract.Run(ns, key="bench-pipeline-soak" if ns.soak else None)
    log_dir = run.log_dir
    tmp = Path(tempfile.mkdtemp(prefix="bench-pipeline-"))
    result: dict[str, Any] = {}
    pg, serve, rx, relay, bare = None, None, None, None, None
    try:
        pg, dsn = processes.start_database(tmp)
        database.load_statements(pg)
        await processes.migrate(dsn)
        if ns.aged:
            result["partitions"] = await database.age(dsn)
        rx = receivers(log_dir, max_s=ns.seconds + ns.soak + 3600)
        await rx.ready()
        relay = start_relay(rx, log_dir)
        await relay.wait_ready()
        if ns.split and ns.cost_rate:
            bare = processes.start_baseline("bare", dsn, processes.DEFAULT_SECRETS, log_dir, 1)
            await bare.wait_ready()
        await _destinations(dsn, rx, enabled=False)
        extra = {**SERVE_ENV, **dict(kv.split("=", 1) for kv in ns.serve_env)}
        serve = processes.start_serve(dsn, processes.DEFAULT_SECRETS, log_dir, extra=extra)
        await serve.wait_ready()
        if not ns.rate:
            result["saturation"] = await saturation(ns, dsn, serve, pg)
            result["relay_saturation"] = await relay_saturation(ns, relay, rx)
        await _destinations(dsn, rx, enabled=True)
        if ns.cost_rate:
            result["cost"] = await cost(ns, serve, relay, rx, dsn, pg, bare)
        if ns.rate:
            rate = ns.rate
        else:
            result["pipeline"] = await pipeline_saturation(ns, serve, dsn, result["saturation"]["rate"])
            rate = (result["pipeline"]["rate"] or ns.probe_min) / 2
        result["latency"] = await latency(ns, rx, serve, rate, dsn, pg)
        if ns.soak:
            result["soak"] = await soak(ns, rx, serve, rate)
            result["deliveries_drained_s"] = await _settle(dsn)
        result["deliveries"] = await _open_deliveries(dsn)
    finally:
        for proc in (serve, relay, bare):
            if proc is not None:
                proc.stop()
        if rx is not None:
            rx.stop()
        if pg is not None:
            pg.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)
    result["parameters"] = contract.parameters(ns)
    return run.finish(result, pipeline_report.table(result), verdict=pipeline_report.verdict(result))
