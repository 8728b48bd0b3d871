"""Drives a server: open model (the schedule decides when each request starts) or closed loop
(N clients back to back, to find the saturation throughput)."""

from __future__ import annotations

import asyncio
import gc
import itertools
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway.core.aio import wait_set
from loadtest.harness.httpclient import HttpError, Pool
from loadtest.harness.plan import Shot
from loadtest.harness.schedule import LagMonitor, Pacer
from loadtest.harness.stats import Ledger, Recorder, classify

MIN_SLEEP_S = 0.001
# uvloop's loop.time() has millisecond resolution (libuv's cached uv_now): too coarse to
# measure sub-millisecond acks. Every timestamp here comes from the performance counter.
clock = time.perf_counter
Sampler = Callable[[], Awaitable[dict[str, float]]]


@dataclass
class OpenResult:
    recorder: Recorder
    elapsed_s: float
    send_span_s: float  # from the start to the last dispatch
    generator_cpu: float  # share of one core the generator process used
    max_dispatch_lag_ms: float
    late_dispatches: int
    warnings: list[str] = field(default_factory=list)
    samples: list[dict[str, float]] = field(default_factory=list)
    started_wall: float = 0.0  # time.time() of the run's start: a shot is due at started_wall + t


class _Cpu:
    def __init__(self) -> None:
        self.wall = time.monotonic()
        self.cpu = time.process_time()

    def share(self) -> float:
        wall = time.monotonic() - self.wall
        return (time.process_time() - self.cpu) / wall if wall > 0 else 0.0


async def run_open(
    shots: Iterable[Shot],
    pool: Pool,
    *,
    duration_s: float,
    ledger: Ledger | None = None,
    sampler: Sampler | None = None,
    progress: bool = True,
    label: str = "",
    warn_after_s: float = 0.010,
    prewarm: int = 64,
) -> OpenResult:
    """Send each shot at its intended time; latency counts from that time, not from the send."""
    loop = asyncio.get_running_loop()
    rec = Recorder()
    lag = LagMonitor(warn_after_s)
    pacer = Pacer(shots, lambda s: s.t)
    inflight: set[asyncio.Task[None]] = set()
    warnings: list[str] = []
    samples: list[dict[str, float]] = []
    cpu = _Cpu()
    t0 = clock() + 0.05
    last_sent = 0.0

    async def fire(shot: Shot, digest: bytes) -> None:
        status: int | None = None
        error: str | None = None
        try:
            status = await pool.request(shot.delivery.wire)
        except HttpError as exc:
            error = exc.kind
        outcome = classify(status, error, shot.delivery.signed_ok)
        if ledger is not None and outcome == "ok":
            ledger.acked(digest)
        rec.on_done(outcome, shot.t, clock() - t0)

    async def ticker() -> None:
        last_done = 0
        while not await wait_set(ticking, 1.0):
            # The ledger grows by thousands of objects a second; a full collection scanning
            # it stalled the generator for up to 0.8 s in a 10-minute run. Frozen objects are
            # skipped by the collector (they are never garbage anyway).
            gc.freeze()
            now = clock() - t0
            rec.close_before(now - pool.timeout_s - 1)
            window_lag = lag.take_window()
            sample: dict[str, float] = {
                "t": round(now, 1),
                "inflight": len(inflight),
                "lag_ms": window_lag * 1000,
            }
            if sampler is not None:
                try:
                    async with asyncio.timeout(0.9):  # not wait_for: gateway.core.aio.wait_set
                        sample.update(await sampler())
                except Exception as exc:
                    sample["sampler_error"] = 1
                    warnings.append(f"sampler failed at {now:.0f}s: {type(exc).__name__}")
            samples.append(sample)
            warn = lag.behind(window_lag)
            if warn and len(warnings) < 20:
                warnings.append(f"t={now:.0f}s: {warn}")
            if progress:
                done = rec.done
                sec = rec.seconds.get(int(now) - 1)
                p99 = sec.summary["p99"] if sec is not None and sec.summary else None
                if sec is not None and p99 is None and sec.latencies_ms:
                    lat = sorted(sec.latencies_ms)
                    p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
                extra = "".join(f"  {k} {sample[k]:.0f}" for k in ("pending", "rss_mb") if k in sample)
                p99s = f"{p99:7.1f}" if p99 is not None else "      -"
                line = (
                    f"\r{label}[{now:5.0f}/{duration_s:.0f}s] {done - last_done:6d} resp/s  sent {rec.sent}"
                    f"  err {sum(rec.errors().values())}  p99(1s) {p99s} ms"
                    f"  inflight {len(inflight)}  behind {window_lag * 1000:4.0f} ms{extra}   "
                )
                sys.stderr.write(line)
                sys.stderr.flush()
                if warn:
                    sys.stderr.write(f"\n  WARNING: {warn}\n")
                last_done = done

    await pool.prewarm(prewarm)
    gc.collect()
    gc.freeze()
    t0 = clock() + 0.05
    started_wall = time.time() + (t0 - clock())
    ticking = asyncio.Event()  # set: the ticker ends (a flag as well as a cancel)
    tick = loop.create_task(ticker())
    try:
        while not pacer.done:
            now = clock() - t0
            for shot in pacer.due(now, limit=256):
                lag.record(shot.t, now)
                digest = ledger.sent(shot.delivery) if ledger is not None else b""
                rec.on_send(shot.kind, shot.t)
                task = loop.create_task(fire(shot, digest))
                inflight.add(task)
                task.add_done_callback(inflight.discard)
                last_sent = now
            wait = pacer.sleep_for(clock() - t0)
            # The event loop's timers tick in milliseconds: a shorter sleep returns at once and
            # the loop would spin a core. Dispatch is then up to 1 ms late, which the latencies
            # (measured from the intended time) include: conservative, never flattering.
            await asyncio.sleep(0 if not wait else max(wait, MIN_SLEEP_S))
        if inflight:
            await asyncio.gather(*list(inflight))
    finally:
        ticking.set()
        tick.cancel()
        # Awaited: a ticker left running would hold asyncio.run's exit, and with it the run's.
        await asyncio.wait({tick})  # its end, not its error: a cancel of this task still goes through
        if progress:
            sys.stderr.write("\n")
    elapsed = clock() - t0
    if lag.late:
        warnings.append(
            f"{lag.late} of {lag.total} requests left the generator > {warn_after_s * 1000:.0f} ms late "
            f"(max {lag.max * 1000:.0f} ms): the generator fell behind the schedule"
        )
    return OpenResult(
        rec, elapsed, last_sent, cpu.share(), lag.max * 1000, lag.late, warnings, samples, started_wall
    )


@dataclass
class ClosedResult:
    throughput: float  # good responses per second in the measuring window
    count: int
    outcomes: dict[str, int]
    generator_cpu: float
    first_error: str = ""


async def run_closed(
    wires: Sequence[tuple[bytes, bool]],
    pool: Pool,
    *,
    concurrency: int,
    duration_s: float,
    warmup_s: float = 1.0,
) -> ClosedResult:
    """``concurrency`` clients send back to back; throughput counts only after the warm-up."""
    loop = asyncio.get_running_loop()
    counter = itertools.count()
    n = len(wires)
    start = clock()
    measure_from = start + warmup_s
    stop_at = measure_from + duration_s
    good = 0
    outcomes: dict[str, int] = {}
    cpu: _Cpu | None = None
    first_error = ""

    async def client() -> None:
        nonlocal good, first_error
        while clock() < stop_at:
            wire, signed_ok = wires[next(counter) % n]
            status: int | None = None
            error: str | None = None
            try:
                status = await pool.request(wire)
            except HttpError as exc:
                error = exc.kind
                first_error = first_error or f"{exc} ({exc.__cause__!r})"
                if exc.kind == "connect":
                    await asyncio.sleep(0.01)  # don't spin on a server that is gone
            if clock() >= measure_from and clock() < stop_at:
                outcome = classify(status, error, signed_ok)
                outcomes[outcome] = outcomes.get(outcome, 0) + 1
                if outcome in ("ok", "rejected_401"):
                    good += 1

    async def cpu_start() -> None:
        nonlocal cpu
        await asyncio.sleep(warmup_s)
        cpu = _Cpu()

    starter = loop.create_task(cpu_start())
    await asyncio.gather(*(client() for _ in range(concurrency)))
    await starter
    share = cpu.share() if cpu is not None else 0.0
    return ClosedResult(good / duration_s, sum(outcomes.values()), outcomes, share, first_error)


def summary_row(result: OpenResult) -> dict[str, Any]:
    from loadtest.harness.stats import summarise

    rec = result.recorder
    ok = rec.outcomes.get("ok", 0) + rec.outcomes.get("rejected_401", 0)
    return {
        "sent": rec.sent,
        "answered": ok,
        "rate_reached": round(rec.sent / result.send_span_s, 1) if result.send_span_s else 0.0,
        "throughput": round(ok / result.elapsed_s, 1) if result.elapsed_s else 0.0,
        "ack_ms": summarise(rec.hist),
        "errors": rec.errors(),
        "generator_cpu": round(result.generator_cpu, 3),
        "max_dispatch_lag_ms": round(result.max_dispatch_lag_ms, 2),
    }
