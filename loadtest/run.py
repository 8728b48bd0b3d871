"""``python -m loadtest run``: drive a gateway on a schedule, verify the database, write the report."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import os
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from gateway.testing.ports import free_port
from loadtest.harness import (
    contract,
    database,
    driver,
    forwardcheck,
    options,
    plan,
    processes,
    report,
    verify,
)
from loadtest.harness.httpclient import Pool
from loadtest.harness.payloads import PayloadFactory, Secrets
from loadtest.harness.receiver import Receiver
from loadtest.harness.resilient import Db
from loadtest.harness.scenarios import SCENARIOS, scenario
from loadtest.harness.schedule import Profile, arrivals, constant, parse_profile
from loadtest.harness.sql import q
from loadtest.harness.stats import Ledger

HELP = "open-model load against the gateway, then verify and report"


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", help="a running gateway (base URL); default: start one (self-contained)")
    p.add_argument("--meta-secret", default=_first(os.environ.get("GATEWAY_META_APP_SECRETS", "")))
    p.add_argument("--tenashi-secret", default=os.environ.get("GATEWAY_TENASHI_SECRET", ""))
    p.add_argument("--rate", type=float, default=100.0, help="constant arrival rate, requests/s")
    p.add_argument("--duration", type=float, default=30.0, help="seconds at --rate")
    p.add_argument(
        "--profile",
        help="instead of --rate/--duration: const:R:S, ramp:R0:R1:S, steps:R:S,R:S..., joined with +",
    )
    p.add_argument("--scenario", default="mixed", choices=sorted(SCENARIOS))
    p.add_argument("--immediate", type=float, default=0.02, help="share of immediate redeliveries")
    p.add_argument("--delayed", type=float, default=0.03, help="share of delayed redeliveries")
    p.add_argument("--delay-s", type=float, default=2.0, help="delay of delayed redeliveries, seconds")
    p.add_argument("--concurrent", type=float, default=0.02, help="share of concurrent redeliveries")
    p.add_argument("--bad-signature", type=float, default=0.01, help="share of badly signed requests")
    p.add_argument(
        "--no-consumers",
        action="store_true",
        help="gateway without consumers (self-contained) / verify the ingest edge only (--url)",
    )
    p.add_argument("--no-verify", action="store_true", help="skip the database verification")
    p.add_argument("--drain-timeout", type=float, default=120.0, help="seconds to wait for consumers")
    p.add_argument("--gateway-env", action="append", default=[], metavar="K=V", help="extra gateway env")
    p.add_argument("--name", default="run", help="stem of the result files")
    p.add_argument(
        "--target-p50-ms", type=float, default=report.META_P50_MS, help="PASS needs ack p50 at most this"
    )
    p.add_argument(
        "--target-p99-ms", type=float, default=report.META_P99_MS, help="PASS needs ack p99 at most this"
    )
    p.add_argument(
        "--forward",
        action="store_true",
        help="self-contained: a fake receiver as a destination of every event; check it got each once",
    )
    p.add_argument(
        "--forward-faults", action="store_true", help="with --forward: 10%% 5xx, 2%% late answers, one outage"
    )
    p.add_argument("--forward-outage-s", type=float, default=30.0, help="receiver outage, seconds")
    p.add_argument(
        "--forward-format",
        choices=("standard", "meta"),
        default="standard",
        help="with --forward: the destination's format (meta: Meta webhook bodies, X-Hub-Signature-256)",
    )
    options.add_common_args(p)


def _first(csv: str) -> str:
    return next((s.strip() for s in csv.split(",") if s.strip()), "")


@dataclass
class Target:
    host: str
    port: int
    dsn: str | None
    gateway_pid: int | None
    receiver: Receiver | None = None  # the fake receiver (run --forward)


@contextlib.asynccontextmanager
async def self_contained(
    ns: argparse.Namespace, secrets: Secrets, log_dir: Path, consumers: bool, extra_env: dict[str, str]
) -> AsyncIterator[Target]:
    """Embedded PostgreSQL (or --database-url), the gateway and the fake provider; stopped after."""
    server = None
    tmp = Path(tempfile.mkdtemp(prefix="loadtest-"))
    procs: list[processes.Proc] = []
    try:
        dsn = ns.database_url
        if not dsn:
            server, dsn = processes.start_database(tmp)
        await processes.migrate(dsn)
        receiver: Receiver | None = None
        if getattr(ns, "forward", False):
            fmt = ns.forward_format
            secret = forwardcheck.new_secret(fmt)
            max_s = ns.duration + ns.drain_timeout + 600
            rx = processes.start_receiver(secret, log_dir, max_s=max_s, meta=fmt == "meta")
            procs.append(rx)
            await rx.wait_ready(path=None)
            receiver = Receiver(rx.url)
            await forwardcheck.register(dsn, receiver.hooks, secret, fmt)
            extra_env = {**forwardcheck.GATEWAY_ENV, **extra_env}
        fake_port = free_port()
        gw = processes.start_gateway(
            dsn,
            secrets,
            log_dir,
            consumers=consumers,
            extra={
                "GATEWAY_DATA_DIR": str(tmp),
                "GATEWAY_GRAPH_URL": f"http://127.0.0.1:{fake_port}",
                **extra_env,
            },
        )
        procs.append(gw)
        await gw.wait_ready()
        fake = processes.start_fake_provider(dsn, secrets, log_dir, gw.url)
        if fake is not None:
            procs.append(fake)
            await fake.wait_ready(path=None)
        yield Target("127.0.0.1", gw.port, dsn, gw.pid, receiver)
    finally:
        for p in reversed(procs):
            p.stop()
        if server is not None:
            with contextlib.suppress(Exception):
                server.cleanup()
        with contextlib.suppress(OSError):
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)


def make_profile(ns: argparse.Namespace) -> Profile:
    return parse_profile(ns.profile) if ns.profile else constant(ns.rate, ns.duration)


def make_sampler(db: Db | None, start_id: int, pid: int | None) -> driver.Sampler:
    rss = processes.RssSampler(pid) if pid else None

    async def sample() -> dict[str, float]:
        out: dict[str, float] = {}
        if db is not None:
            # None while the database is away: the run goes on, the sample says so.
            got = await db.call(lambda conn: verify.backlog(conn, start_id))
            if got is None:
                out["db_down"] = 1.0
            else:
                out["pending"] = float(got[0])
                out["lag_s"] = got[1]
        if rss is not None:
            out["rss_mb"] = rss.mb()
        return out

    return sample


async def execute(ns: argparse.Namespace, target: Target, secrets: Secrets) -> dict[str, Any]:
    """One run against ``target``; its result (judged by ``report.run_verdict``).

    The harness's own database connections survive a database restart during the run (they
    reconnect), so a run that takes PostgreSQL away still ends with a verification.
    """
    profile = make_profile(ns)
    factory = PayloadFactory(secrets, ns.seed, run_tag=f"{os.getpid():x}{int(time.time()):x}")
    mix = plan.Mix(ns.immediate, ns.delayed, ns.concurrent, ns.bad_signature, ns.delay_s)
    picked = scenario(ns.scenario, factory, tenashi=bool(secrets.tenashi))
    shots = plan.build(arrivals(profile), picked, factory, mix, ns.seed)
    db = Db(target.dsn) if target.dsn else None
    verifying = db is not None and not ns.no_verify
    sampler_db = db
    start_id = 0
    if db is not None:
        start_id = int(await db.wait(lambda conn: conn.fetchval(q("lt_inbox_max_id")), 60.0))
        if not await db.wait(lambda conn: verify.columns(conn, "processed_webhook_events"), 60.0):
            # No consumers yet: every row stays pending, and counting them each second would
            # load the database more and more as the run goes on. Sample memory only.
            sampler_db = None
        elif await db.wait(verify.on_citus, 60.0):
            # The backlog is per worker on Citus (verify.wait_keys_processed): not sampled.
            sampler_db = None
    ledger = Ledger()
    pool = Pool(target.host, target.port, ns.connections, ns.timeout)
    started = dt.datetime.now(dt.UTC)
    fault_task = None
    forwarding: dict[str, Any] | None = None
    if target.receiver and ns.forward_faults:
        fault_task = asyncio.create_task(
            forwardcheck.faults(target.receiver, profile.duration, ns.forward_outage_s)
        )
    try:
        res = await driver.run_open(
            shots,
            pool,
            duration_s=profile.duration,
            ledger=ledger,
            sampler=make_sampler(sampler_db, start_id, target.gateway_pid),
            progress=not ns.quiet,
        )
        pool.close()
        verdict = None
        if verifying:
            assert db is not None
            sys.stderr.write("verifying (waiting for consumers to drain)...\n")
            consumers = False if ns.no_consumers else None
            conn = await db.connection(timeout_s=ns.drain_timeout)
            verdict = await verify.verify(conn, ledger.entries, start_id, ns.drain_timeout, consumers)
            verdict.e2e_timeline = await verify.e2e_timeline(conn, start_id, started)
        if fault_task is not None:
            await fault_task
        if target.receiver and target.dsn:
            sys.stderr.write("verifying forwarding (waiting for the forwarder to drain)...\n")
            forwarding = await forwardcheck.verify(
                target.dsn, target.receiver, start_id, ns.drain_timeout, ns.forward_format
            )
    finally:
        if db is not None:
            await db.close()
    summary = driver.summary_row(res)
    result: dict[str, Any] = {
        "parameters": contract.parameters(ns),
        "target_rate": profile.expected_count() / profile.duration,
        "duration_s": profile.duration,
        "started": started.isoformat(),
        "summary": summary,
        "sent_by_kind": dict(res.recorder.kinds),
        "timeline": res.recorder.timeline(),
        "per_minute": minute_rows(res.recorder.per_minute(), res.samples),
        "samples": res.samples,
        "warnings": res.warnings,
        "verification": verdict.as_dict() if verdict else None,
        "e2e_timeline": verdict.e2e_timeline if verdict else [],
    }
    if not secrets.tenashi:
        res.warnings.append("Meta events only: no Tenashi secret given")
    if forwarding is not None:
        result["forwarding"] = forwarding
    return result


def minute_rows(ack: list[dict[str, float]], samples: list[dict[str, float]]) -> list[dict[str, float]]:
    """Per minute: ack percentiles, and the peaks of backlog, consumer lag and gateway memory."""
    rows = []
    for a in ack:
        m = a["minute"]
        inside = [s for s in samples if m * 60 <= s["t"] < (m + 1) * 60]
        row = dict(a)
        for key in ("pending", "lag_s", "rss_mb"):
            vals = [s[key] for s in inside if key in s]
            if vals:
                row[f"{key}_max"] = max(vals)
        rows.append(row)
    return rows


def secrets_from(ns: argparse.Namespace, self_contained_mode: bool) -> Secrets:
    """The started gateway's secrets, or the given ones; without a Tenashi secret, Meta only."""
    if self_contained_mode:
        return processes.DEFAULT_SECRETS
    if not ns.meta_secret:
        raise SystemExit(
            "--url needs --meta-secret (or GATEWAY_META_APP_SECRETS); --tenashi-secret is optional"
        )
    return Secrets(meta=ns.meta_secret, tenashi=ns.tenashi_secret or "")


async def main(ns: argparse.Namespace) -> int:
    run = contract.Run(ns)
    log_dir = run.log_dir
    extra_env = dict(kv.split("=", 1) for kv in ns.gateway_env)
    if ns.url:
        u = urlsplit(ns.url)
        secrets = secrets_from(ns, False)
        target = Target(u.hostname or "127.0.0.1", u.port or 80, ns.database_url, None)
        if not target.dsn and not ns.no_verify:
            sys.stderr.write(database.no_database_hint() + "\n")
        result = await execute(ns, target, secrets)
    else:
        secrets = secrets_from(ns, True)
        async with self_contained(ns, secrets, log_dir, not ns.no_consumers, extra_env) as target:
            result = await execute(ns, target, secrets)
    verdict = report.run_verdict(result, p50_ms=ns.target_p50_ms, p99_ms=ns.target_p99_ms)
    if ns.no_verify:
        verdict.notes = ["not verified (--no-verify)"]
    elif ns.url and not target.dsn:
        verdict.notes = [database.no_database_hint()]
    text = report.run_table(result)
    if "forwarding" in result:
        text += "\n" + forwardcheck.describe(result["forwarding"])
    for w in result["warnings"]:
        text += f"\nWARNING: {w}"
    shown = {v for v in (secrets.meta, secrets.tenashi) if v}
    return run.finish(result, text, report.run_charts(result, verdict), secrets=shown, verdict=verdict)
