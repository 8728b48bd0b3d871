"""Load with redeliveries against a gateway whose DATABASE_URL is a Citus coordinator
(``python -m loadtest run`` and its verifier) while the cluster changes under it: a third
worker added and the shards rebalanced onto it, a worker SIGKILLed and started again, the
coordinator SIGKILLed and started again in the middle of a rebalance that drains that worker
(the rebalance resumes by itself). After each: every acknowledged
webhook stored once, every event of an acknowledged webhook processed once, its side effects
neither lost nor doubled, no badly signed body stored (the verifier's checks).

The tests share one cluster of their own (they add a worker and kill nodes, which the
session's cluster of the other tests must not see) and run in file order: each judges only
the rows of its own run. The figures they print (503s, seconds) are what docs/scaling.md
reports with `python -m loadtest run` at larger sizes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from gateway.testing import citus
from loadtest.harness.database import citus_database
from tests.support.citus_db import own_cluster
from tests.support.citusload import (
    CLUSTER_SETTINGS,
    errors,
    failed_checks,
    flowing,
    misplaced,
    moves_running,
    placements,
    rebalance,
    rebalance_wait,
    start_load,
    start_rebalance,
)

pytestmark = pytest.mark.citus


@pytest.fixture(scope="module")
def load_cluster(citus_cluster: citus.Cluster) -> Iterator[citus.Cluster]:
    """A coordinator and two workers from the session cluster's build."""
    with own_cluster(citus_cluster, "load", settings=CLUSTER_SETTINGS) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def load_dsn(load_cluster: citus.Cluster) -> str:
    return asyncio.run(citus_database(load_cluster, "gw_load"))


def _judge(result: dict[str, Any], what: str) -> None:
    failed = failed_checks(result)
    print(f"\n{what}: {result['summary']}")  # the 503s and timeouts, by class: the run's figures
    assert not failed, f"{what}: {failed}"


# ~70 s here, of which the rebalance ~60 s; a move task that fails is retried by Citus after
# 5 s, 20 s, then a minute, so the rebalance is given 300 s and the test more than that.
@pytest.mark.timeout(480)
async def test_worker_added_and_shards_moved_under_load(
    load_cluster: citus.Cluster, load_dsn: str, tmp_path: Path
) -> None:
    before = await placements(load_dsn)
    with start_load(load_dsn, tmp_path, rate=100, duration=20) as run:
        await flowing(load_dsn)
        await asyncio.sleep(2)
        node = await load_cluster.add_worker()
        # block_writes: delivery_log's partitions have no replica identity, which logical
        # replication needs (the default mode refuses them; docs/scaling.md).
        seconds = await rebalance(load_dsn, "block_writes", timeout_s=300)
        result = await run.finish()
    after = await placements(load_dsn)
    print(f"\nrebalance onto {node.name}: {seconds:.1f} s, placements {before} -> {after}")
    _judge(result, "shard move")
    summary = result["summary"]
    # The whole load is answered here (block_writes holds writes, it does not fail them), but
    # the floor is loose for a busy machine: what it catches is ingest not working on Citus.
    assert summary["answered"] >= 0.5 * summary["sent"], errors(result)
    assert after.get(node.port, 0) > 0, after
    # (Not a count compared with before: the gateway makes day partitions ahead as it starts.)
    assert await misplaced(load_dsn) == 0


async def test_worker_killed_mid_load_nothing_lost(
    load_cluster: citus.Cluster, load_dsn: str, tmp_path: Path
) -> None:
    victim = load_cluster.workers[1]
    # 90 s to drain: the consumers need ~15 s for this run; what is left after 90 s is stuck.
    with start_load(load_dsn, tmp_path, rate=100, duration=15, drain_timeout=90) as run:
        t0 = await flowing(load_dsn)
        await asyncio.sleep(5)
        load_cluster.kill(victim)
        killed = time.monotonic() - t0
        await asyncio.sleep(6)  # ingest with one worker gone
        await asyncio.to_thread(load_cluster.restart, victim)
        result = await run.finish()
    what = f"{victim.name} SIGKILLed for 6 s"
    print(f"\n{what}: {result['summary']}")
    failed = failed_checks(result)
    # The edge's promise holds: every 200 a durable row, none doubled, none forged.
    assert not [f for f in failed if f.startswith("ingest:")], f"{what}: {failed}"
    timeline = result["timeline"]
    assert isinstance(timeline, list)
    # While the worker was down, the edge staged batches in the lanes of the other workers'
    # shards (groupcommit's lane rest): 200s kept coming every second.
    down = [s for s in timeline if killed + 1 <= s["t"] < killed + 5]
    assert down and all(s["ok"] > 0 for s in down), down
    # And once it is back, every event of an acknowledged webhook is processed once.
    assert not failed, f"{what}: {failed}"


@pytest.mark.timeout(420)  # the run's own bound is 280 s (tests/support/citusload.py)
async def test_coordinator_killed_mid_load_and_mid_rebalance_nothing_lost(
    load_cluster: citus.Cluster, load_dsn: str, tmp_path: Path
) -> None:
    # The worker the first test added is drained by a rebalance (its shards moved back to the
    # others) and the coordinator is SIGKILLed while that job and the load run: the job, kept in
    # pg_dist_background_job, resumes once the coordinator is back.
    drained = load_cluster.workers[-1]
    assert (await placements(load_dsn)).get(drained.port, 0) > 0, "the first test's worker has no shards"
    with start_load(load_dsn, tmp_path, rate=100, duration=10) as run:
        await flowing(load_dsn)
        conn = await asyncpg.connect(load_dsn, timeout=30)
        try:
            await conn.execute(
                "SELECT citus_set_node_property('127.0.0.1', $1, 'shouldhaveshards', false)", drained.port
            )
            await start_rebalance(conn, "block_writes", parallel=True)
        finally:
            await conn.close()
        moving = await moves_running(load_dsn)
        await asyncio.sleep(1)  # into the move
        load_cluster.kill(load_cluster.coordinator)
        await asyncio.sleep(2)
        await asyncio.to_thread(load_cluster.restart, load_cluster.coordinator)
        seconds = await rebalance_wait(load_dsn)
        result = await run.finish()
    after = await placements(load_dsn)
    print(f"\nrebalance interrupted ({moving} moving), done {seconds:.1f} s after the restart: {after}")
    _judge(result, "coordinator SIGKILLed for 2 s mid-rebalance")
    assert moving > 0, "no move of the rebalance started"
    assert after.get(drained.port, 0) == 0, after
    assert await misplaced(load_dsn) == 0
