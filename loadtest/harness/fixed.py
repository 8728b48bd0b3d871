"""bench-ingest's fixed-connection phase: ``wrk -t1 -cN`` against each server in turn, the
servers interleaved within a round so that machine noise hits them alike.

Servers: ``bare`` (verifies the signature, stores nothing), ``edge`` (``gateway serve``, one
process, no background services) and ``serve`` (``gateway serve`` as a user runs it: its
process layout by core count, consumers, sender and forwarder on). For ``serve`` the staged
backlog is sampled during the run and after it: the consumers keep up when what is left at the
end of the run is at most a second of what was ingested. ``serve`` gets requests never sent
before (a repeated body is a redelivery, which the consumers skip for almost nothing).

Each run's CPU per request (its server's process tree and PostgreSQL, from /proc) is counted
from the start of the run until its work is done: for ``serve``, until its consumers drained
what the run staged. Its ratio to the bare handler's (the bare handler's own process) is the
serve cost target.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gateway.core.aio import sleep_unless_stopped
from gateway.store import inbox
from gateway.store.db import connect
from loadtest.harness import processes, wrk
from loadtest.harness.cpu import CpuMeter
from loadtest.harness.payloads import PayloadFactory
from loadtest.harness.scenarios import scenario

SERVERS = ("bare", "edge", "serve")
TARGET_EDGE = 0.85
TARGET_SERVE = 0.70
TARGET_SERVE_COST = 3.0  # serve's CPU per webhook (its processes + PostgreSQL) / the bare handler's
BACKLOG_CAP = 1_000_000
SAMPLE_S = 0.5
DRAIN_TIMEOUT_S = 120.0


@dataclass
class Run:
    server: str
    connections: int
    round: int
    rate: float
    p50_ms: float
    p99_ms: float
    non2xx: int
    socket_errors: int
    cpu: dict[str, float]
    repeats: int = 0  # requests sent a second time (serve: redeliveries)
    # CPU per request, microseconds, of the server's process tree and of PostgreSQL: from the
    # start of the run until its work is done (serve: until its consumers drained what it took).
    us_per_request: dict[str, float] = field(default_factory=dict)
    backlog_max: int | None = None
    backlog_end: int | None = None
    drain_s: float | None = None
    backlog: list[tuple[float, int]] = field(default_factory=list)


def kept_up(run: dict[str, Any]) -> bool:
    """The consumers kept up: the backlog at the end of the run was at most a second's worth
    of ingest."""
    return run["backlog_end"] is not None and run["backlog_end"] <= max(run["rate"], 1.0)


Ensure = Callable[[str], Awaitable[processes.Proc]]


class Requests:
    """Request files for wrk: one shared by the servers that store nothing for the consumers,
    and a fresh one per ``serve`` run."""

    def __init__(self, ns: Any, directory: Path) -> None:
        self.ns = ns
        self.dir = directory
        self._n = 0
        self.factory = PayloadFactory(processes.DEFAULT_SECRETS, ns.seed, run_tag=f"f{int(time.time()):x}")
        self.scenario = scenario(ns.fixed_scenario, self.factory, tenashi=False)
        self.shared = self.fresh()

    def _wires(self) -> Iterator[bytes]:
        for _ in range(self.ns.fixed_requests):
            d = self.scenario.next()
            if d.signed_ok:
                yield d.wire

    def fresh(self) -> tuple[Path, int]:
        self._n += 1
        target = self.dir / f"requests-{self._n}.bin"
        sys.stderr.write(f"writing {self.ns.fixed_requests} signed requests ({target.name})...\n")
        return target, wrk.write_requests(target, self._wires())


async def _backlog(dsn: str) -> int:
    conn = await connect(dsn)
    try:
        return await inbox.depth(conn, cap=BACKLOG_CAP)
    finally:
        await conn.close()


async def _sample(dsn: str, stop: asyncio.Event, out: list[tuple[float, int]]) -> None:
    started = time.monotonic()
    conn = await connect(dsn)
    try:
        while not stop.is_set():
            out.append((round(time.monotonic() - started, 2), await inbox.depth(conn, cap=BACKLOG_CAP)))
            await sleep_unless_stopped(stop, SAMPLE_S)
    finally:
        await conn.close()


async def _drained(dsn: str) -> float | None:
    """Seconds until no staged row is pending (None: not within DRAIN_TIMEOUT_S)."""
    started = time.monotonic()
    while await _backlog(dsn):
        if time.monotonic() - started > DRAIN_TIMEOUT_S:
            return None
        await asyncio.sleep(0.1)
    return round(time.monotonic() - started, 2)


async def one(
    ns: Any,
    dsn: str,
    ensure: Ensure,
    pg: Any,
    reqs: Requests,
    server: str,
    connections: int,
    rnd: int,
    truncate: Callable[[str], Awaitable[None]],
) -> Run:
    proc = await ensure(server)
    if server == "serve":
        await _drained(dsn)  # what an earlier run left is not this run's backlog
    await truncate(dsn)
    path, n = reqs.fresh() if server == "serve" else reqs.shared
    runner = wrk.Wrk(path, ns.wrk)
    samples: list[tuple[float, int]] = []
    stop = asyncio.Event()
    sampler = asyncio.create_task(_sample(dsn, stop, samples)) if server == "serve" else None
    meter = CpuMeter(proc.pid, pg)
    meter.start()
    try:
        r = await runner.run(proc.port, connections, ns.fixed_duration)
    finally:
        shares = meter.shares()
        stop.set()
        if sampler is not None:
            await sampler
        runner.close()
    run = Run(
        server, connections, rnd, r.rate, r.p50_ms, r.p99_ms, r.non2xx, r.socket_errors, shares,
        repeats=max(0, r.requests - n),
    )  # fmt: skip
    if server == "serve":
        run.backlog = samples
        run.backlog_max = max((b for _, b in samples), default=0)
        run.backlog_end = await _backlog(dsn)
        run.drain_s = await _drained(dsn)
    used = meter.used()
    run.us_per_request = {
        k: round(used.get(k, 0.0) / max(r.requests, 1) * 1e6, 1) for k in ("server", "postgres")
    }
    sys.stderr.write(
        f"fixed round {rnd + 1} {server:5s} -c{connections:<4d} {r.rate:8.0f}/s  p99 {r.p99_ms:.1f} ms  "
        f"non-2xx {r.non2xx} errors {r.socket_errors}  cpu {shares}"
        + f"  us/request {run.us_per_request}"
        + (f"  backlog max {run.backlog_max} end {run.backlog_end} drained in {run.drain_s} s"
           if server == "serve" else "")
        + "\n"
    )  # fmt: skip
    return run


async def phase(
    ns: Any,
    dsns: dict[str, str],
    default_dsn: str,
    ensure: Ensure,
    pg: Any,
    truncate: Callable[[str], Awaitable[None]],
) -> dict[str, Any]:
    """Every server at every connection count, ``ns.rounds`` times; ratios within each round.
    ``dsns``: a server's database where it has one of its own (else ``default_dsn``)."""
    levels = [int(x) for x in str(ns.fixed).split(",") if x.strip()]
    with tempfile.TemporaryDirectory(prefix="bench-fixed-") as tmp:
        reqs = Requests(ns, Path(tmp))
        # Unmeasured first: connections opened, caches warm.
        for name in SERVERS:
            proc = await ensure(name)
            warm = wrk.Wrk(reqs.shared[0], ns.wrk)
            try:
                await warm.run(proc.port, max(levels), 2)
            finally:
                warm.close()
        runs: list[Run] = []
        for rnd in range(ns.rounds):
            for c in levels:
                for name in SERVERS:
                    db = dsns.get(name, default_dsn)
                    runs.append(await one(ns, db, ensure, pg, reqs, name, c, rnd, truncate))
    return summarise(runs, levels)


def cost(run: Run) -> float:
    """CPU per request: the server's process tree and PostgreSQL (a bare handler uses none)."""
    return run.us_per_request.get("server", 0.0) + (
        0.0 if run.server == "bare" else run.us_per_request.get("postgres", 0.0)
    )


def summarise(runs: list[Run], levels: list[int]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "runs": [asdict(r) for r in runs],
        "levels": levels,
        "ratios": {},
        "cost_ratios": {},
    }
    for c in levels:
        by_round: dict[int, dict[str, Run]] = {}
        for r in runs:
            if r.connections == c:
                by_round.setdefault(r.round, {})[r.server] = r
        for name in ("edge", "serve"):
            per = [rs[name].rate / rs["bare"].rate for rs in by_round.values() if rs["bare"].rate]
            out["ratios"][f"{name}/bare c{c}"] = {
                "median": statistics.median(per) if per else 0.0,
                "rounds": per,
            }
        per = [cost(rs["serve"]) / cost(rs["bare"]) for rs in by_round.values() if cost(rs["bare"])]
        out["cost_ratios"][f"serve/bare CPU per request c{c}"] = {
            "median": statistics.median(per) if per else float("nan"),
            "rounds": per,
        }
    out["serve_kept_up"] = all(kept_up(r) for r in out["runs"] if r["server"] == "serve")
    return out
