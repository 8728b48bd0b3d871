"""Load runs against a Citus cluster of their own (tests/citus/test_load.py): the gateway's
schema migrated and distributed on it as ``gateway migrate --citus`` leaves it, and
``python -m loadtest run`` driving a gateway whose DATABASE_URL is the coordinator, in its own
process, while the test adds a worker, moves shards or kills a node beside it."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg

REPO = Path(__file__).resolve().parents[2]


@dataclass
class LoadRun:
    """``python -m loadtest run`` in its own process (self-contained: it starts the gateway and
    the fake provider on the given database), its JSON result read when it ends."""

    proc: subprocess.Popen[bytes]
    results: Path
    log: Path
    started: float
    budget_s: float  # from the start to its end at the latest: the load, the drain and a margin

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    async def finish(self) -> dict[str, Any]:
        deadline = self.started + self.budget_s
        while self.proc.poll() is None:
            if time.monotonic() > deadline:
                self.proc.kill()
                raise AssertionError(
                    f"loadtest run had not ended {self.budget_s:.0f} s after its start:\n{self.tail()}"
                )
            await asyncio.sleep(0.5)
        found = sorted(self.results.glob("*.json"))
        if not found:
            raise AssertionError(
                f"loadtest run exited {self.proc.returncode} without a result:\n{self.tail()}"
            )
        result: dict[str, Any] = json.loads(found[-1].read_text())
        result["exit_status"] = self.proc.returncode
        return result

    def __enter__(self) -> LoadRun:
        return self

    def __exit__(self, *exc: object) -> None:
        """A test that failed midway stops the run (it stops the gateway it started)."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def tail(self, n: int = 40) -> str:
        lines = self.log.read_text(errors="replace").splitlines()
        return "\n".join(lines[-n:])


def start_load(
    dsn: str,
    results: Path,
    *,
    rate: float,
    duration: float,
    drain_timeout: float = 180.0,
    extra: tuple[str, ...] = (),
) -> LoadRun:
    """Signed Meta and Tenashi webhooks at ``rate``/s for ``duration`` s with the default
    redeliveries (2 % immediate, 3 % delayed, 2 % concurrent) and 1 % bad signatures; latency
    targets loose (a shared machine): the tests judge the verification, not the speed."""
    results.mkdir(parents=True, exist_ok=True)
    argv = [
        sys.executable, "-m", "loadtest", "run",
        "--database-url", dsn,
        "--rate", str(rate), "--duration", str(duration),
        "--drain-timeout", str(drain_timeout),
        "--target-p50-ms", "5000", "--target-p99-ms", "30000",
        "--results", str(results), "--name", "citus", "--quiet",
        *extra,
    ]  # fmt: skip
    log = results / "loadtest.log"
    out = log.open("wb")
    proc = subprocess.Popen(argv, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env={**os.environ})
    # Its gateway's start-up and the verification's reads besides the load and the drain.
    return LoadRun(proc, results, log, time.monotonic(), duration + drain_timeout + 90)


def failed_checks(result: dict[str, Any]) -> list[str]:
    """The verification's failed checks, and a missing verification as one."""
    v = result.get("verification")
    if not v:
        return ["no verification in the result"]
    return [f"{c['name']}: {c.get('detail', '')}" for c in v["checks"] if not c["ok"]]


def errors(result: dict[str, Any]) -> dict[str, int]:
    """Answers that were not a 200 (nor a 401 to a bad signature), by class: ``http_503``..."""
    return {str(k): int(n) for k, n in result["summary"]["errors"].items()}


async def flowing(dsn: str, timeout_s: float = 60.0) -> float:
    """Once the run's webhooks are being stored (more rows than when called): that moment
    (``time.monotonic()``), which is within a second of the run's t = 0."""
    conn = await asyncpg.connect(dsn, timeout=30)
    try:
        base = await conn.fetchval("SELECT count(*) FROM webhook_inbox")
        deadline = time.monotonic() + timeout_s
        while await conn.fetchval("SELECT count(*) FROM webhook_inbox") == base:
            if time.monotonic() > deadline:
                raise AssertionError(f"no webhook stored within {timeout_s:.0f}s")
            await asyncio.sleep(0.2)
        return time.monotonic()
    finally:
        await conn.close()


async def placements(dsn: str) -> dict[int, int]:
    """Shard placements of the distributed tables per worker port."""
    conn = await asyncpg.connect(dsn, timeout=30)
    try:
        rows = await conn.fetch(
            "SELECT nodeport, count(*) AS n FROM citus_shards"
            " WHERE citus_table_type = 'distributed' GROUP BY 1"
        )
    finally:
        await conn.close()
    return {int(r["nodeport"]): int(r["n"]) for r in rows}


async def misplaced(dsn: str) -> int:
    """Shards of the distributed tables (hash-distributed or single-shard; not the reference
    tables, ``repmodel`` 't', which have a placement on every node) that do not have exactly
    one placement (a move that lost or doubled one)."""
    conn = await asyncpg.connect(dsn, timeout=30)
    try:
        n: int = await conn.fetchval(
            "SELECT count(*) FROM pg_dist_shard s JOIN pg_dist_partition p USING (logicalrelid)"
            " WHERE p.partmethod IN ('h', 'n') AND p.repmodel <> 't'"
            " AND (SELECT count(*) FROM pg_dist_placement x WHERE x.shardid = s.shardid) <> 1"
        )
    finally:
        await conn.close()
    return n


# Moves that run side by side: the shards of one colocation group together, and several
# groups at once up to citus.max_background_task_executors_per_node (CLUSTER_SETTINGS). A
# quarter faster than one move at a time here (25 s against 33 s on an idle cluster).
PARALLEL = ", parallel_transfer_colocated_shards => true, parallel_transfer_reference_tables => true"
CLUSTER_SETTINGS = {"citus.max_background_task_executors_per_node": "4"}


async def rebalance(dsn: str, mode: str, *, timeout_s: float) -> float:
    """Move shards onto the cluster's newest nodes (``citus_rebalance_start``) and wait for the
    background job (``citus_rebalance_wait``); its seconds."""
    started = time.monotonic()
    conn = await asyncpg.connect(dsn, timeout=30)
    try:
        await start_rebalance(conn, mode, parallel=True)
    finally:
        await conn.close()
    # A bound on a hung job, not a speed claim, below the test's own timeout so that the
    # failure names the tasks.
    await rebalance_wait(dsn, timeout_s=timeout_s)
    return time.monotonic() - started


async def rebalance_wait(dsn: str, timeout_s: float = 120.0) -> float:
    """Seconds until the cluster's rebalance job has ended (``citus_rebalance_wait``), connecting
    again while the coordinator is still in crash recovery."""
    started = time.monotonic()
    deadline = started + timeout_s
    while True:
        try:
            conn = await asyncpg.connect(dsn, timeout=10)
            break
        except (OSError, asyncpg.CannotConnectNowError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)
    try:
        await conn.execute(f"SET statement_timeout = {int(max(deadline - time.monotonic(), 1) * 1000)}")
        try:
            await conn.execute("SELECT citus_rebalance_wait()")
        except asyncpg.QueryCanceledError:
            raise AssertionError(
                f"the rebalance job had not ended {timeout_s:.0f} s on; its tasks that did not"
                f" finish or were retried: {await troubled_tasks(conn)}"
            ) from None
        troubled = await troubled_tasks(conn)
    finally:
        await conn.close()
    seconds = time.monotonic() - started
    if troubled:  # a task that failed is retried after 5 s, 20 s, then every minute (Citus)
        print(f"\nrebalance tasks retried ({seconds:.0f} s in all): {troubled}")
    return seconds


async def troubled_tasks(conn: asyncpg.Connection) -> list[str]:
    """The last rebalance job's tasks that are not done or were retried: status, retries and
    the last error (``pg_dist_background_task``)."""
    rows = await conn.fetch(
        "SELECT task_id, status::text AS status, coalesce(retry_count, 0) AS retries, message"
        " FROM pg_dist_background_task"
        " WHERE job_id = (SELECT max(job_id) FROM pg_dist_background_job)"
        " AND (status <> 'done' OR coalesce(retry_count, 0) > 0) ORDER BY task_id"
    )
    return [
        f"task {r['task_id']} {r['status']} retried {r['retries']}: {(r['message'] or '').strip()[:300]}"
        for r in rows
    ]


async def moves_running(dsn: str, timeout_s: float = 30.0) -> int:
    """Once tasks of the rebalance job are moving shard groups: how many (0 if none did within
    ``timeout_s``; the job's first tasks wait for its background task monitor)."""
    conn = await asyncpg.connect(dsn, timeout=30)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            n: int = await conn.fetchval(
                "SELECT count(*) FROM pg_dist_background_task WHERE status = 'running'"
            )
            if n or time.monotonic() > deadline:
                return n
            await asyncio.sleep(0.1)
    finally:
        await conn.close()


async def start_rebalance(
    conn: asyncpg.Connection, mode: str = "block_writes", timeout_s: float = 60.0, *, parallel: bool = False
) -> None:
    """``citus_rebalance_start``, again while Citus says another shard operation holds the
    colocation groups' lock (seen right after ``citus_add_node``: it fails at once rather
    than waiting), or when it was a deadlock's victim (seen while a gateway that had just
    started made its day partitions ahead: a rebalance that did not start changed nothing)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            options = PARALLEL if parallel else ""
            await conn.execute(f"SELECT citus_rebalance_start(shard_transfer_mode => '{mode}'{options})")
            return
        except asyncpg.DeadlockDetectedError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(1.0)
        except asyncpg.InternalServerError as exc:
            if "could not acquire the lock" not in str(exc) or time.monotonic() > deadline:
                raise
            await asyncio.sleep(1.0)
