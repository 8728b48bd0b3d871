"""The maintenance service: the periodic jobs (retention, reconciler, gauges) of a process.

Each job runs on its own interval; a failing run is logged and tried again at the next
interval, never stopping the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import asyncpg

from gateway.core.aio import sleep_unless_stopped
from gateway.core.heartbeat import HEARTBEATS
from gateway.core.settings import Settings
from gateway.maintenance import gauges, retention
from gateway.maintenance.reconciler import Reconciler
from gateway.store import audit
from gateway.store.db import DB_ERRORS

log = logging.getLogger(__name__)

GAUGE_INTERVAL_S = 5.0
RECONCILE_INTERVAL_S = 5.0


@dataclass(frozen=True, slots=True)
class Job:
    name: str
    interval_s: float
    run: Callable[[asyncio.Event], Awaitable[Any]]
    close: Callable[[], Awaitable[None]] | None = None


def jobs_for(
    pool: asyncpg.Pool, settings: Settings, *, inbound: bool, outbound: bool, forward: bool = False
) -> list[Job]:
    """The jobs that go with the services a process runs (``forward`` needs none of its own:
    its gauges are database-wide, refreshed by the gauge leader whichever process that is)."""
    jobs: list[Job] = []
    if settings.database_url:
        # One process of all those running jobs exports the database-wide gauges.
        lead = gauges.GaugeLeader(settings.database_url, timeout_s=settings.db_connect_timeout_s)
        jobs.append(Job("database gauges", GAUGE_INTERVAL_S, lambda _stop: lead.run_once(), lead.close))
    if inbound or outbound or forward:
        # Partitions ahead, retention behind: one job for every table, one replica at a time.
        jobs.append(
            Job("retention", settings.purge_interval_s, lambda stop: _retention(pool, settings, stop))
        )
    if outbound:
        reconciler = Reconciler(pool, settings)
        jobs.append(Job("reconciler", RECONCILE_INTERVAL_S, lambda _stop: reconciler.run_once()))
    return jobs


async def _retention(pool: asyncpg.Pool, settings: Settings, stop: asyncio.Event) -> None:
    """A maintenance pass, and its outcome where operators look (the console's overview): a
    pass another replica ran is that replica's to record."""
    try:
        report = await retention.run_once(pool, settings, stop)
    except Exception as exc:
        # When the database is what failed, the failure's log line is all there is.
        with contextlib.suppress(*DB_ERRORS):
            await audit.record_pass(pool, job="retention", error=f"{type(exc).__name__}: {exc}"[:500])
        raise
    if report.ran:
        await audit.record_pass(pool, job="retention", error=None)


class Maintenance:
    """Every job of a process, each in its own loop until ``stop`` (a service:
    gateway.runtime.services)."""

    name = "maintenance"
    stop_grace_s: float | None = None  # each job checks ``stop``; retention stops between batches

    def __init__(
        self, pool: asyncpg.Pool, settings: Settings, *, inbound: bool, outbound: bool, forward: bool = False
    ) -> None:
        self.jobs = jobs_for(pool, settings, inbound=inbound, outbound=outbound, forward=forward)
        self.liveness_s = settings.liveness_s

    async def run(self, stop: asyncio.Event) -> None:
        await asyncio.gather(*(_loop(j, stop, self.liveness_s) for j in self.jobs))

    async def close(self) -> None:
        """Release what the jobs hold (the gauge leader's lock and connection)."""
        for j in self.jobs:
            if j.close is not None:
                await j.close()


async def _loop(job: Job, stop: asyncio.Event, liveness_s: float) -> None:
    # A turn: one run, then the interval; silent longer than both, the job is stuck.
    beat = HEARTBEATS.loop(f"maintenance: {job.name}", job.interval_s + liveness_s)
    try:
        while not stop.is_set():
            beat()
            try:
                await job.run(stop)
            except Exception as exc:
                log.warning("%s failed: %s: %s", job.name, type(exc).__name__, exc)
            beat()
            await sleep_unless_stopped(stop, job.interval_s)
    finally:
        beat.done()
