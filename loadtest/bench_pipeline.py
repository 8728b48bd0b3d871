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

Self-contained: an embedded PostgreSQL in a temporary directory, whatever ``--database-url``
or $DATABASE_URL say (it truncates tables and measures the server's CPU). Prints only what
it measured, the load average included; exits 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime as dt
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import psutil

from gateway.core import stdwebhooks
from gateway.store import deliveries
from gateway.store.db import connect
from loadtest.harness import fixed, forwardcheck, processes, report, segments, sustain, wrk
from loadtest.harness.cpu import CpuMeter, postgres_pids, tree
from loadtest.harness.driver import run_open
from loadtest.harness.httpclient import Pool
from loadtest.harness.options import add_common_args
from loadtest.harness.payloads import PayloadFactory
from loadtest.harness.plan import NO_DUPLICATES, build
from loadtest.harness.scenarios import SCENARIOS, scenario
from loadtest.harness.schedule import arrivals, constant
from loadtest.harness.sql import q
from loadtest.harness.stats import percentile

HELP = "webhooks through the default gateway serve to a Standard Webhooks and a Meta-format destination"
TARGET_P99_MS = 100.0
TARGET_RSS_MB = 150.0
CORES = ("server", "postgres", "machine", "steal")
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
    p.add_argument("--serve-env", action="append", default=[], metavar="K=V", help="extra env of serve")
    p.add_argument("--name", default="bench-pipeline")
    add_common_args(p)


class Receivers:
    """The two fake receivers, by destination name."""

    def __init__(self, log_dir: Path, max_s: float) -> None:
        self.secrets = {"std": stdwebhooks.generate_secret(), "meta": META_SECRET}
        self.procs = {
            name: forwardcheck.start_receiver(
                self.secrets[name], log_dir, max_s, meta=fmt == "meta", name=f"receiver-{name}"
            )
            for name, fmt in DESTINATIONS.items()
        }

    async def ready(self) -> None:
        for p in self.procs.values():
            await p.wait_ready(None)

    def base(self, name: str) -> str:
        return f"http://127.0.0.1:{self.procs[name].port}"

    async def call(self, method: str, name: str, path: str, **kw: Any) -> dict[str, Any]:
        async with aiohttp.ClientSession() as http, http.request(method, self.base(name) + path, **kw) as r:
            out: dict[str, Any] = await r.json()
            return out

    def stop(self) -> None:
        for p in self.procs.values():
            p.stop()


async def _destinations(dsn: str, rx: Receivers, enabled: bool) -> None:
    conn = await connect(dsn)
    try:
        for name, fmt in DESTINATIONS.items():
            if await deliveries.get_destination(conn, name=name) is None:
                await deliveries.add_destination(
                    conn, name=name, url=rx.base(name) + "/hooks", events=["message", "status", "account"],
                    secret=rx.secrets[name], max_in_flight=256, ordered=False, format=fmt,
                )  # fmt: skip
            await deliveries.set_enabled(conn, name=name, enabled=enabled)
    finally:
        await conn.close()


async def _open_deliveries(dsn: str) -> dict[str, int]:
    conn = await connect(dsn)
    try:
        rows = await conn.fetch("SELECT state, count(*) AS n FROM deliveries GROUP BY state")
        return {r["state"]: r["n"] for r in rows}
    finally:
        await conn.close()


async def saturation(ns: argparse.Namespace, dsn: str, serve: processes.Proc, pg: Any) -> dict[str, Any]:
    async def ensure(name: str) -> processes.Proc:
        return serve

    async def truncate(dsn: str) -> None:
        conn = await connect(dsn)
        try:
            await conn.execute("TRUNCATE webhook_inbox")
        finally:
            await conn.close()

    levels = [int(x) for x in ns.conns.split(",") if x.strip()]
    with tempfile.TemporaryDirectory(prefix="bench-pipeline-") as tmp:
        reqs = fixed.Requests(ns, Path(tmp))
        runs = [await fixed.one(ns, dsn, ensure, pg, reqs, "serve", c, 0, truncate) for c in levels]
    best = max(runs, key=lambda r: r.rate)
    return {"runs": [dataclasses.asdict(r) for r in runs], "rate": best.rate, "connections": best.connections}


async def _open_work(dsn: str) -> tuple[int, int]:
    """(staged rows pending, deliveries not yet delivered)."""
    conn = await connect(dsn)
    try:
        row = await conn.fetchrow(q("pipeline_open_work"))
        assert row is not None
        return int(row["pending"]), int(row["undelivered"])
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
    for name in DESTINATIONS:
        await rx.call("DELETE", name, "/_fake/state")
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
        st = await rx.call(
            "GET", name, "/_fake/wait", params={"processed": str(len(events)), "timeout": "60"}
        )
        ids = (await rx.call("GET", name, "/_fake/state", params={"ids": "1"}))["ids"]
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
    for name in DESTINATIONS:
        await rx.call("DELETE", name, "/_fake/state")
        await rx.call("POST", name, "/_fake/config", json={"count_only": True})
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


def rss_verdict(
    rss: dict[str, list[tuple[float, float]]], seconds: float
) -> list[tuple[str, float, float, float]]:
    """Per process: (name, peak of the first minute, peak of the last minute, peak)."""
    out = []
    for name, series in rss.items():
        first = [v for t, v in series if t <= 60.0] or [series[0][1]]
        last = [v for t, v in series if t >= seconds - 60.0] or [series[-1][1]]
        out.append((name, max(first), max(last), max(v for _, v in series)))
    return out


async def main(ns: argparse.Namespace) -> int:
    ns.wrk = wrk.path()
    if ns.wrk is None and not ns.rate:
        print(wrk.INSTALL, file=sys.stderr)
        return 2
    ns.results.mkdir(parents=True, exist_ok=True)
    stem = f"{ns.name}-{dt.datetime.now().strftime('%Y%m%d-%H%M%S')}"
    log_dir = ns.results / f"{stem}-logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="bench-pipeline-"))
    result: dict[str, Any] = {"load_average": list(os.getloadavg()), "parameters": _parameters(ns)}
    pg, serve, rx = None, None, None
    try:
        pg, dsn = processes.start_database(tmp)
        await processes.migrate(dsn)
        rx = Receivers(log_dir, max_s=ns.seconds + ns.soak + 3600)
        await rx.ready()
        await _destinations(dsn, rx, enabled=False)
        extra = {**SERVE_ENV, **dict(kv.split("=", 1) for kv in ns.serve_env)}
        serve = processes.start_serve(dsn, processes.DEFAULT_SECRETS, log_dir, extra=extra)
        await serve.wait_ready()
        if ns.rate:
            rate = ns.rate
            await _destinations(dsn, rx, enabled=True)
        else:
            result["saturation"] = await saturation(ns, dsn, serve, pg)
            await _destinations(dsn, rx, enabled=True)
            result["pipeline"] = await pipeline_saturation(ns, serve, dsn, result["saturation"]["rate"])
            rate = (result["pipeline"]["rate"] or ns.probe_min) / 2
        result["latency"] = await latency(ns, rx, serve, rate, dsn, pg)
        if ns.soak:
            result["soak"] = await soak(ns, rx, serve, rate)
            result["deliveries_drained_s"] = await _settle(dsn)
        result["deliveries"] = await _open_deliveries(dsn)
        result["load_average_after"] = list(os.getloadavg())
    finally:
        if serve is not None:
            serve.stop()
        if rx is not None:
            rx.stop()
        if pg is not None:
            pg.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)
    text = table(result)
    print(text)
    verdict = pipeline_verdict(result)
    jpath, hpath = report.write(ns.results, stem, result, text, [], verdict)
    print(f"\nresults: {jpath}\n         {hpath}")
    print(verdict.summary())
    return 0 if verdict.passed else 1


def pipeline_verdict(r: dict[str, Any]) -> report.Verdict:
    v = report.Verdict()
    for name, d in r["latency"]["destinations"].items():
        v.targets.append(
            report.Target(
                f"receipt -> {d['format']} destination 2xx p99", d["p99_ms"], TARGET_P99_MS, "<=", " ms"
            )
        )
        for what in ("missing", "duplicates", "bad_signatures"):
            if d[what]:
                v.failed_checks.append(f"{name}: {d[what]} {what.replace('_', ' ')}")
    if r["latency"]["acks"]["errors"]:
        v.failed_checks.append(f"webhooks not acknowledged: {r['latency']['acks']['errors']}")
    pipe = r.get("pipeline")
    if pipe is not None and not pipe["rate"]:
        v.failed_checks.append(f"the pipeline kept up at no rate probed (from {pipe['low']:.0f}/s)")
    sat = r.get("saturation")
    if sat is not None:
        for run in sat["runs"]:
            if not fixed.kept_up(run):
                v.failed_checks.append(f"saturation -c{run['connections']}: the consumers fell behind")
    if "soak" in r:
        s = r["soak"]
        for name, first, last, peak in rss_verdict(s["rss"], s["seconds"]):
            v.targets.append(report.Target(f"RSS {name} peak", peak, TARGET_RSS_MB, "<=", " MB"))
            v.targets.append(
                report.Target(
                    f"RSS {name} last-minute growth", last - first, min(20.0, 0.1 * first), "<=", " MB"
                )
            )
        if r.get("deliveries_drained_s") is None:
            v.failed_checks.append("deliveries not drained within 120 s after the soak")
        if set(r["deliveries"]) - {"delivered"}:
            v.failed_checks.append(f"deliveries not all delivered: {r['deliveries']}")
    return v


def table(r: dict[str, Any]) -> str:
    start = " / ".join(f"{x:.2f}" for x in r["load_average"])
    end = " / ".join(f"{x:.2f}" for x in r.get("load_average_after", []))
    out = f"load average (1, 5, 15 min) at the start {start}, at the end {end}\n"
    if "saturation" in r:
        runs = r["saturation"]["runs"]
        out += "\ningest saturation of the default serve (destinations disabled)\n" + report.table(
            ("conns", "req/s", "p99 ms", "backlog end", "drained s", "cores srv / pg / machine / stolen"),
            [
                (str(x["connections"]), f"{x['rate']:.0f}", f"{x['p99_ms']:.1f}", str(x["backlog_end"]),
                 str(x["drain_s"]), " / ".join(f"{x['cpu'].get(k, 0):.2f}" for k in CORES))
                for x in runs
            ],
        )  # fmt: skip
    if "pipeline" in r:
        pipe = r["pipeline"]
        out += (
            f"\n\npipeline saturation (both destinations enabled): {pipe['rate']:.0f} webhooks/s "
            f"(kept up there; fell behind at {pipe['high']:.0f}/s)\n"
        )
        out += report.table(
            ("probe req/s", "staged left", "deliveries left", "errors", "kept up", "settled s"),
            [
                (f"{x['rate']:.0f}", str(x["pending"]), str(x["undelivered"]), str(x["errors"]),
                 "yes" if x["kept_up"] else "no", str(x["settled_s"]))
                for x in pipe["probes"]
            ],
        )  # fmt: skip
    lat = r["latency"]
    seconds = r["parameters"]["seconds"]
    out += (
        f"\n\nreceipt -> downstream 2xx at {lat['rate']:.0f} webhooks/s for {seconds:.0f} s "
        f"({lat['events']} events, each to both destinations)\n"
    )
    out += report.table(
        ("destination", "format", "p50 ms", "p90", "p99", "max", "processed", "missing", "dups", "bad sig"),
        [
            (name, d["format"], *(f"{d[k]:.1f}" for k in ("p50_ms", "p90_ms", "p99_ms", "max_ms")),
             str(d["processed"]), str(d["missing"]), str(d["duplicates"]), str(d["bad_signatures"]))
            for name, d in lat["destinations"].items()
        ],
    )  # fmt: skip
    out += "\n\nwhere the time went (every event and destination; the database's and receivers' clocks)\n"
    out += report.table(
        ("segment", "p50 ms", "p90", "p99"),
        [
            (k, *(f"{v[q]:.1f}" for q in ("p50_ms", "p90_ms", "p99_ms")))
            for k, v in lat.get("segments", {}).items()
        ],
    )
    out += "\ncores used meanwhile: " + ", ".join(f"{k} {v:.2f}" for k, v in lat.get("cores", {}).items())
    out += " (steal: taken by the hypervisor)" if lat.get("cores", {}).get("steal") else ""
    if "soak" in r:
        s = r["soak"]
        out += f"\n\nsoak: {s['seconds']:.0f} s at {s['rate']:.0f}/s, {s['sent']} webhooks"
        out += f", errors {s['errors']}\n"
        out += report.table(
            ("process", "first minute peak MB", "last minute peak MB", "peak MB"),
            [(n, f"{a:.1f}", f"{b:.1f}", f"{c:.1f}") for n, a, b, c in rss_verdict(s["rss"], s["seconds"])],
        )
        out += f"\ndeliveries drained {r.get('deliveries_drained_s')} s after the soak"
    out += f"\ndeliveries by state: {r.get('deliveries')}"
    return out


def _parameters(ns: argparse.Namespace) -> dict[str, Any]:
    return {k: str(v) if isinstance(v, Path) else v for k, v in vars(ns).items() if k not in ("main", "func")}
