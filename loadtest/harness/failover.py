"""``python -m loadtest chaos --failover``: PostgreSQL fails over under load, and every promise
holds.

A real cluster (``gateway.testing.patroni``: etcd, three Patroni nodes on the wheel's
PostgreSQL, ``synchronous_mode: true``); the gateway is given every node in one multi-host
``DATABASE_URL`` with ``target_session_attrs=read-write``. Under steady signed webhooks (with
redeliveries and bad signatures), sends through the fake provider (some of which hang past the
sender's read timeout: unknown) and status webhooks the fake posts back (retried while the
gateway answers 503, as Meta does), each round:

- odd rounds crash the primary's node (SIGKILL to Patroni, the postmaster and every backend),
  then start its Patroni again once another node leads;
- even rounds freeze it (SIGSTOP) past Patroni's TTL, as a hung machine or a partition, and
  continue it (SIGCONT) once another node leads;

Patroni promotes the synchronous standby; the old primary rejoins as a replica. Per round:
the seconds without a writable primary (a probe that commits every 0.1 s), Patroni's own
promotion time, the webhooks answered 503 from the fault to the first 200 after the
promotion, the seconds from the promotion to that 200, to every process LISTENing on the new
primary again (``pg_stat_activity``), to the old primary streaming from the new one, and to
the backlog drained. At the end the verification of ``chaos``: every acknowledged webhook
stored once and processed once, every send received at most once, nothing left ``pending``,
``sending`` or ``unknown`` (the unknown sends reconciled by their status webhooks).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import shutil
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import asyncpg

from gateway.store.db import connect_any
from gateway.store.listen import LISTENER_NAME
from gateway.testing.patroni import TTL_S, Cluster, Node
from gateway.testing.ports import free_port
from loadtest.harness import contract, driver, processes, verify
from loadtest.harness.chaoskit import (
    Cast,
    TimedPool,
    fake_faults,
    fake_received,
    fake_webhooks,
    ledger_webhooks,
    outage_figures,
    send_checks,
    send_load,
    webhook_load,
)
from loadtest.harness.resilient import Db
from loadtest.harness.sql import q

FAULT_AT = 4.0  # seconds into a round
FREEZE_PAST_TTL_S = 5.0  # a frozen primary is continued this long after its key could expire
TARGET_FIRST_200_S = 5.0  # promotion -> first 200, plus the gateway's reconnect backoff (none
# for ingest: the group committer connects again at its next batch)
NAN = float("nan")
RECOVERED = "failover: every round recovered by itself"
TARGET = f"failover: promotion -> first 200 within {TARGET_FIRST_200_S:g} s (target)"


@dataclass
class FailoverRound:
    n: int
    fault: str  # "kill" or "freeze"
    fault_at: float = NAN  # wall clock (the fake provider's receipts are timed by it)
    old_leader: str = ""
    promoted: str = ""
    promoted_was_sync: bool = False
    no_writable_s: float = NAN  # fault -> the first commit sent after it that was acknowledged
    promotion_s: float = NAN  # fault -> Patroni reports another leader running
    answered_503: int = 0  # webhooks answered 503 from the fault to the first 200 after promotion
    failed_other: int = 0  # connection errors and timeouts in that span
    first_200_s: float = NAN  # promotion -> first webhook 200
    relisten_s: float = NAN  # promotion -> every LISTEN session on the new primary
    rejoined_s: float = NAN  # fault -> the old primary streams from the new one
    drained_s: float = NAN  # promotion -> the oldest pending inbox row younger than 1 s
    notes: list[str] = field(default_factory=list)


class WriteProbe:
    """Commits a transaction every 0.1 s through the gateway's own multi-host connect: when
    each acknowledged commit was sent (by the primary and its synchronous standby)."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.ok: list[float] = []

    async def run(self, stop: asyncio.Event) -> None:
        conn: asyncpg.Connection | None = None
        while not stop.is_set():
            started = time.monotonic()
            try:
                if conn is None or conn.is_closed():
                    conn = await connect_any(self.dsn, timeout=1.0)
                    started = time.monotonic()
                await conn.fetchval("SELECT txid_current()", timeout=1.0)
                self.ok.append(started)
            except Exception:
                if conn is not None:
                    conn.terminate()
                conn = None
            await asyncio.sleep(0.1)
        if conn is not None:
            conn.terminate()

    def gap(self, fault: float) -> float:
        """From the fault to the first commit sent after it that was acknowledged."""
        return min((t for t in self.ok if t > fault), default=NAN) - fault


async def listeners(cluster: Cluster, node: Node) -> Counter[str]:
    """The LISTEN sessions on ``node``, by channel (their application_name says which)."""
    try:
        conn = await asyncpg.connect(cluster.node_dsn(node), timeout=2)
    except Exception:
        return Counter()
    try:
        rows = await conn.fetch(
            "SELECT application_name FROM pg_stat_activity WHERE application_name LIKE $1",
            LISTENER_NAME + "%",
        )
        return Counter(str(r["application_name"])[len(LISTENER_NAME) :] for r in rows)
    finally:
        await conn.close()


async def until(deadline: float, check: Any, every_s: float = 0.2) -> float:
    """Poll ``check()`` (async, truthy when done) until ``deadline``: when it held, or NaN."""
    while time.monotonic() < deadline:
        if await check():
            return time.monotonic()
        await asyncio.sleep(every_s)
    return NAN


async def one_round(
    r: FailoverRound,
    cluster: Cluster,
    pool: TimedPool,
    probe: WriteProbe,
    db: Db,
    start_id: int,
    expected: Counter[str],
    end: float,
) -> None:
    members = await cluster.members()
    old = await cluster.leader()
    if old is None:
        r.notes.append("no leader before the fault")
        return
    r.old_leader = old.name
    sync = {str(m["name"]) for m in members if m.get("role") == "sync_standby"}
    fault, r.fault_at = time.monotonic(), time.time()
    if r.fault == "kill":
        cluster.kill(old)
    else:
        cluster.freeze(old)
    new = await cluster.wait_leader(TTL_S * 3, other_than=old)
    promoted = time.monotonic()
    r.promoted, r.promoted_was_sync = new.name, new.name in sync
    r.promotion_s = promoted - fault
    if not r.promoted_was_sync:
        r.notes.append(f"promoted {new.name}, not the synchronous standby {sorted(sync)}")

    async def listening() -> bool:
        return await listeners(cluster, new) >= expected

    async def rejoined() -> bool:
        for m in await cluster.members():
            if m.get("name") == old.name:
                return m.get("state") == "streaming" and m.get("role") in ("replica", "sync_standby")
        return False

    async def drained() -> bool:
        got = await db.call(lambda conn: verify.backlog(conn, start_id))
        return got is not None and got[1] < 1.0

    # Watched from the promotion on, while the old primary is brought back.
    watch = [
        asyncio.create_task(until(end, check, every)) for check, every in ((listening, 0.2), (drained, 0.25))
    ]
    if r.fault == "kill":
        cluster.start_node(old)  # rejoins as a replica (pg_rewind when it must)
    else:
        await asyncio.sleep(max(0.0, fault + TTL_S + FREEZE_PAST_TTL_S - time.monotonic()))
        cluster.thaw(old)  # its Patroni finds another leader and demotes it
    relistened, drained_at = await asyncio.gather(*watch)
    r.relisten_s, r.drained_s = relistened - promoted, drained_at - promoted
    r.rejoined_s = await until(end, rejoined, 0.5) - fault
    r.no_writable_s = probe.gap(fault)
    r.answered_503, r.failed_other, r.first_200_s = outage_figures(
        pool.answers, pool.failures, fault, promoted
    )
    for name, value in (("first 200", r.first_200_s), ("re-LISTEN", r.relisten_s), ("drain", r.drained_s)):
        if math.isnan(value):
            r.notes.append(f"no {name} within the round")
    if math.isnan(r.rejoined_s):
        r.notes.append("the old primary did not rejoin within the round")
    with contextlib.suppress(TimeoutError):
        await cluster.wait_healthy(max(1.0, end - time.monotonic()))


def table(rounds: list[FailoverRound]) -> str:
    head = (
        "| round | fault | old → new leader | no writable primary (s) | Patroni promotion (s) "
        "| webhooks 503 | conn. errors | promotion → first 200 (s) | → re-LISTEN (s) "
        "| → backlog drained (s) | old primary rejoined (s) |"
    )
    lines = [head, "| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rounds:
        sync = "" if r.promoted_was_sync else " (not sync)"
        lines.append(
            f"| {r.n} | {r.fault} | {r.old_leader} → {r.promoted}{sync} | {r.no_writable_s:.1f} "
            f"| {r.promotion_s:.1f} | {r.answered_503} | {r.failed_other} | {r.first_200_s:.2f} "
            f"| {r.relisten_s:.1f} | {r.drained_s:.1f} | {r.rejoined_s:.1f} |"
        )
    return "\n".join(lines)


def round_checks(rounds: list[FailoverRound]) -> list[verify.Check]:
    """Pure: each round recovered without a hand (a leader promoted, writes, LISTEN back, the
    backlog drained, the old primary a replica), and the target from promotion to first 200."""
    bad = [r for r in rounds if r.notes]
    slow = [r for r in rounds if not r.first_200_s <= TARGET_FIRST_200_S]
    return [
        verify.Check(
            RECOVERED,
            not bad,
            f"{len(rounds) - len(bad)} of {len(rounds)} rounds clean",
            tuple(f"round {r.n}: {'; '.join(r.notes)}" for r in bad)[:3],
        ),
        verify.Check(
            TARGET,
            not slow,
            f"worst {max((r.first_200_s for r in rounds), default=NAN):.2f} s",
            tuple(f"round {r.n}: {r.first_200_s:.2f} s" for r in slow)[:3],
        ),
    ]


async def main(ns: argparse.Namespace) -> int:
    round_s = ns.round_s or 75.0
    if round_s < 50:
        raise SystemExit("--round-s must be at least 50 with --failover (Patroni's TTL is 20 s)")
    run = contract.Run(ns, key="chaos-failover")
    log_dir = run.log_dir
    tmp = Path(tempfile.mkdtemp(prefix="failover-"))
    cluster = Cluster(tmp / "cluster")
    secrets = processes.DEFAULT_SECRETS
    port = free_port()
    cast: Cast | None = None
    fake: processes.Proc | None = None
    db: Db | None = None
    stop = asyncio.Event()
    result: dict[str, Any] = {}
    lines: list[str] = []
    try:
        sys.stderr.write("starting etcd and three Patroni nodes...\n")
        await cluster.start()
        dsn = cluster.dsn()
        await processes.migrate(dsn)
        fake_env = {"GATEWAY_FAKE_WEBHOOK_RETRY_S": "300"}
        fake = processes.start_fake_provider(dsn, secrets, log_dir, f"http://127.0.0.1:{port}", fake_env)
        cast = Cast(dsn, secrets, log_dir, fake.url, ns.pair_interval_s, port=port)
        cast.env.update({"GATEWAY_LOG_LEVEL": "info", "GATEWAY_RUN_FORWARDER": "true"})
        db = Db(dsn)
        await fake.wait_ready(path=None)
        gw = cast.start("gateway")
        cast.start("consumer")
        cast.start("sender")
        await gw.wait_ready(timeout_s=60)
        start_id = int(await db.wait(lambda conn: conn.fetchval(q("lt_inbox_max_id")), 30))
        leader = await cluster.wait_leader(10)
        deadline = time.monotonic() + 30
        expected: Counter[str] = Counter()
        while time.monotonic() < deadline and len(expected) < 3:
            expected = await listeners(cluster, leader)
            await asyncio.sleep(0.3)
        sys.stderr.write(f"listening before the first fault: {dict(expected)}\n")
        duration = ns.rounds * round_s + 5
        _factory, ledger, pool, load = webhook_load(secrets, ns.seed, ns.rate, duration, "f", cast.port)
        accepted: set[str] = set()
        send_counts: Counter[str] = Counter()
        probe = WriteProbe(dsn)
        background = [
            asyncio.create_task(send_load(gw.url, ns.send_rate, ns.recipients, stop, accepted, send_counts)),
            asyncio.create_task(probe.run(stop)),
        ]
        rounds: list[FailoverRound] = []
        t0 = time.monotonic()
        for n in range(1, ns.rounds + 1):
            base = t0 + (n - 1) * round_s
            await asyncio.sleep(max(0.0, base + FAULT_AT - time.monotonic()))
            r = FailoverRound(n, "kill" if n % 2 else "freeze")
            # Some sends hang past the sender's read timeout around the fault: unknown sends.
            await fake_faults(fake.url, [{"action": "hang", "times": 2, "hang_ms": 4000}])
            await one_round(r, cluster, pool, probe, db, start_id, expected, base + round_s - 1)
            for role in ("gateway", "consumer", "sender"):
                if not cast.procs[role].alive():
                    r.notes.append(f"{role} exited ({cast.procs[role].popen.returncode}): restarted")
                    cast.start(role)
            rounds.append(r)
            sys.stderr.write(f"round {n}: {asdict(r)}\n")
        res = await load
        stop.set()
        await asyncio.gather(*background)
        pool.close()
        sys.stderr.write("verifying (waiting for consumers and senders to drain)...\n")
        conn = await db.connection(timeout_s=60)
        # Unknown sends settle by their status webhooks, which the verification must count.
        settle = time.monotonic() + ns.drain_timeout
        while time.monotonic() < settle and await conn.fetchval(q("lt_outbox_open")):  # noqa: ASYNC110
            await asyncio.sleep(0.5)
        ledger_webhooks(ledger, await fake_webhooks(fake.url))
        verdict = await verify.verify(conn, ledger.entries, start_id, ns.drain_timeout, None)
        outbox = {r["callback_data"]: r["state"] for r in await conn.fetch(q("lt_outbox_states_all"))}
        checks, send_stats = send_checks(await fake_received(fake.url), outbox, accepted, ns.pair_interval_s)
        open_rows = {k: v for k, v in outbox.items() if v in ("pending", "sending", "unknown")}
        checks.append(
            verify.Check(
                "sends: none left pending, sending or unknown (unknown ones reconciled)",
                not open_rows,
                f"{len(open_rows)} open: {dict(Counter(open_rows.values()))}",
                tuple(list(open_rows)[:3]),
            )
        )
        verdict.checks += checks + round_checks(rounds)
        summary = driver.summary_row(res)
        lines = [
            table(rounds),
            f"\nwebhooks: {summary['sent']} sent, outcomes {dict(res.recorder.outcomes)}",
            f"sends: API answers {dict(send_counts)}; {send_stats}",
        ]
        for c in verdict.checks:
            lines.append(f"{'ok  ' if c.ok else 'FAIL'} {c.name}: {c.detail}")
            lines += [f"     e.g. {e}" for e in (c.examples if not c.ok else ())]
            run.check(c.name, c.ok, c.detail)
        lines.append(f"logs: {log_dir} (Patroni's: {tmp / 'cluster'}, removed at exit)")
        result = {
            "rounds": [asdict(r) for r in rounds],
            "webhooks": summary,
            "sends": {"answers": dict(send_counts), **send_stats},
            "verification": verdict.as_dict(),
        }
    finally:
        stop.set()
        if cast is not None:
            cast.stop_all()
        if fake is not None:
            fake.stop()
        if db is not None:
            await db.close()
        if run.verdict.failed_checks or not result:
            with contextlib.suppress(OSError):
                for node in cluster.nodes:
                    shutil.copy(node.dir / "patroni.log", log_dir / f"patroni-{node.name}.log")
        cluster.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return run.finish(result, "\n".join(lines))
