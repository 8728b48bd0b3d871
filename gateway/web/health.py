"""/healthz (process up, every long-running loop beating), /readyz (a writable primary
reachable, schema current), /metrics.

``/healthz`` answers 503, naming them, when loops of the process have not beaten within their
bound (``gateway.core.heartbeat``): a supervisor (the serve parent, an orchestrator's probe)
should replace the process.

``/readyz`` answers from the result of a probe run in the background once a second, and
``/metrics`` from the registry (the database-wide gauges are refreshed by a maintenance job,
not at scrape time): a flood of either cannot queue on the pool the send API and the
consumers need. ``/metrics`` is prometheus_client's own aiohttp handler (text or OpenMetrics
by the Accept header, gzip by Accept-Encoding).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web
from prometheus_client import REGISTRY, CollectorRegistry, multiprocess
from prometheus_client.aiohttp import make_aiohttp_handler

from gateway import metrics
from gateway.core.heartbeat import HEARTBEATS
from gateway.store.database import Database
from gateway.store.db import latest_version, readiness

log = logging.getLogger(__name__)

PROBE_INTERVAL_S = 1.0
PROBE_TIMEOUT_S = 2.0
# The probe loop beats once a turn (interval + timeout at most); silent this long, it is stuck.
PROBE_BOUND_S = 30.0

# Set by the parent of `gateway serve --workers N` for its children (gateway.runtime.workers).
MULTIPROC_DIR = os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


def _registry() -> CollectorRegistry:
    """This process's metrics or, under ``--workers`` (PROMETHEUS_MULTIPROC_DIR set), those of
    every worker combined: behind one port a scrape reaches any worker, so each must answer
    for all of them (a registry per process would make every counter jump between workers)."""
    if MULTIPROC_DIR is None:
        return REGISTRY
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=MULTIPROC_DIR)  # type: ignore[no-untyped-call]
    return registry


metrics_handler = make_aiohttp_handler(_registry())


async def healthz(request: web.Request) -> web.Response:
    # The pid tells which worker answered (several share the port under --workers).
    stale = HEARTBEATS.stale()
    if not stale:
        return web.json_response({"status": "ok", "pid": os.getpid()})
    loops = [{"loop": s.name, "silent_s": round(s.age_s, 1), "bound_s": s.bound_s} for s in stale]
    return web.json_response({"status": "stuck", "pid": os.getpid(), "loops": loops}, status=503)


class HealthChecks:
    """Health routes, probing ``db`` (open while the app runs)."""

    def __init__(
        self, db: Database, interval_s: float = PROBE_INTERVAL_S, timeout_s: float = PROBE_TIMEOUT_S
    ) -> None:
        self.db = db
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self._status = 503
        self._body: dict[str, Any] = {"status": "unavailable", "reason": "starting"}
        self._checked_at: float | None = None

    def routes(self, *, metrics: bool = True) -> list[web.RouteDef]:
        routes = [web.get("/healthz", healthz), web.get("/readyz", self.readyz)]
        if metrics:
            routes.append(web.get("/metrics", metrics_handler))
        return routes

    async def probe(self) -> None:
        """Check the database and the schema once; the answer ``/readyz`` gives until the next.
        Ready needs a primary that takes writes: during a failover (no primary yet, or a
        pooled connection still on a server that became a standby or read-only) it is 503, and
        the pool's connections are replaced, so new ones find the writable primary."""
        try:
            pool = self.db.pool
            async with asyncio.timeout(self.timeout_s):
                version, writable = await readiness(pool)
        except Exception as exc:
            self._set(503, {"status": "unavailable", "reason": f"database: {type(exc).__name__}"})
            return
        want = latest_version()
        if not writable:
            await pool.expire_connections()
            self._set(503, {"status": "unavailable", "reason": "database: not a writable primary"})
        elif version < want:
            self._set(503, {"status": "unavailable", "reason": f"schema at {version}, want {want}"})
        else:
            self._set(200, {"status": "ready", "schema": version})

    def _set(self, status: int, body: dict[str, Any]) -> None:
        metrics.DB_WRITABLE.set(1 if status == 200 else 0)
        if status != self._status:
            log.log(logging.INFO if status == 200 else logging.WARNING, "readiness: %s", body)
        self._status, self._body, self._checked_at = status, body, time.monotonic()

    @contextlib.asynccontextmanager
    async def probing(self) -> AsyncIterator[None]:
        """Probe once now (the first answer is real), then in the background until exit."""
        await self.probe()

        async def loop() -> None:
            beat = HEARTBEATS.loop("readiness probe", PROBE_BOUND_S)
            try:
                while True:
                    beat()
                    await asyncio.sleep(self.interval_s)
                    await self.probe()
            finally:
                beat.done()

        task = asyncio.create_task(loop())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def readyz(self, request: web.Request) -> web.Response:
        at = self._checked_at
        if at is None or time.monotonic() - at > 3 * self.interval_s + self.timeout_s:
            # The probe itself is stuck: say so rather than repeat an old "ready".
            stalled = {"status": "unavailable", "reason": "readiness probe stalled"}
            return web.json_response(stalled, status=503)
        return web.json_response(self._body, status=self._status)


def metrics_app() -> web.Application:
    """The separate metrics listener: ``/metrics`` and ``/healthz`` only."""
    app = web.Application()
    app.router.add_routes([web.get("/healthz", healthz), web.get("/metrics", metrics_handler)])
    return app


class ListenError(OSError):
    """A listener's port could not be bound (names the variable for the message)."""

    def __init__(self, exc: OSError, host: str, port: int, variable: str = "GATEWAY_METRICS_PORT") -> None:
        super().__init__(exc.errno, exc.strerror)
        self.host, self.port, self.variable = host, port, variable


@contextlib.asynccontextmanager
async def health_socket(path: str) -> AsyncIterator[None]:
    """``/healthz`` on a Unix socket of its own: how the parent of ``gateway serve --workers N``
    asks one worker (they share the TCP port, where any of them may answer)."""
    app = web.Application()
    app.router.add_get("/healthz", healthz)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.UnixSite(runner, path).start()
        yield
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def metrics_listener(host: str, port: int) -> AsyncIterator[web.AppRunner]:
    """Serve ``metrics_app`` on ``host:port`` for the duration of the block."""
    runner = web.AppRunner(metrics_app(), access_log=None)
    await runner.setup()
    try:
        # Under --workers every worker serves the metrics port too (each answers for all).
        site = web.TCPSite(runner, host, port, reuse_port=MULTIPROC_DIR is not None or None)
        try:
            await site.start()
        except OSError as exc:
            raise ListenError(exc, host, port) from exc
        log.info("metrics on http://%s:%d/metrics", host, port)
        yield runner
    finally:
        await runner.cleanup()
