"""bench-consumers' peer: PGQueuer (a PostgreSQL job queue on PyPI) draining no-op jobs on
the same PostgreSQL, in this process as the consumers are: ``dequeuers`` queue managers, each
on its own connection, fetching ``batch`` jobs at a time until the queue is empty (its
``drain`` mode), completions written as PGQueuer writes them. Its schema is installed beside
the gateway's in the benchmark's scratch database."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

import asyncpg
from pgqueuer import AsyncpgDriver, Job, Queries, QueueManager
from pgqueuer.types import QueueExecutionMode

from loadtest.harness.cpu import CpuMeter
from loadtest.harness.sql import queries

SQL = queries("baseline.sql")
ENTRYPOINT = "noop"
ENQUEUE_CHUNK = 5000


async def install(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        q = Queries(AsyncpgDriver(conn))
        if not await q.schema_is_installed():
            await q.install()
    finally:
        await conn.close()


async def drain(dsn: str, jobs: int, batch: int, dequeuers: int, meter: CpuMeter | None = None) -> float:
    """Jobs per second to drain ``jobs`` no-op jobs (enqueued beforehand, not timed; ``meter``
    is started when the drain is)."""
    conns = [await asyncpg.connect(dsn) for _ in range(dequeuers + 1)]
    try:
        await conns[0].execute(SQL["peer_reset"])
        q = Queries(AsyncpgDriver(conns[0]))
        for lo in range(0, jobs, ENQUEUE_CHUNK):
            n = min(ENQUEUE_CHUNK, jobs - lo)
            await q.enqueue([ENTRYPOINT] * n, [None] * n, [0] * n)
        done = 0

        def manager(conn: asyncpg.Connection) -> QueueManager:
            qm = QueueManager(Queries(AsyncpgDriver(conn)))

            @qm.entrypoint(ENTRYPOINT)
            async def noop(job: Job) -> None:
                nonlocal done
                done += 1

            return qm

        managers = [manager(c) for c in conns[1:]]
        if meter is not None:
            meter.start()
        started = time.perf_counter()
        await asyncio.gather(
            *(
                qm.run(batch_size=batch, mode=QueueExecutionMode.drain, dequeue_timeout=timedelta(seconds=1))
                for qm in managers
            )
        )
        elapsed = time.perf_counter() - started
        left = await conns[0].fetchval(SQL["peer_left"])
        if done != jobs or left:
            raise RuntimeError(f"PGQueuer ran {done} of {jobs} jobs, {left} left in its queue")
        return jobs / elapsed
    finally:
        for c in conns:
            await c.close()
