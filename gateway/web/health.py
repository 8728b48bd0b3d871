"""/healthz (process up), /readyz (database reachable, schema current), /metrics."""

from __future__ import annotations

import asyncio
import logging

import asyncpg
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gateway import metrics
from gateway.store import inbox
from gateway.store.db import latest_version, schema_version

log = logging.getLogger(__name__)


class Health:
    """Health routes; ``pool`` is set once the app's database is up."""

    def __init__(self) -> None:
        self.pool: asyncpg.Pool | None = None

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/healthz", self.healthz),
            web.get("/readyz", self.readyz),
            web.get("/metrics", self.metrics),
        ]

    async def healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(self, request: web.Request) -> web.Response:
        try:
            assert self.pool is not None, "database not up yet"
            async with asyncio.timeout(2):
                version = await schema_version(self.pool)
        except Exception as exc:
            return web.json_response(
                {"status": "unavailable", "reason": f"database: {type(exc).__name__}"}, status=503
            )
        want = latest_version()
        if version < want:
            return web.json_response(
                {"status": "unavailable", "reason": f"schema at {version}, want {want}"}, status=503
            )
        return web.json_response({"status": "ready", "schema": version})

    async def metrics(self, request: web.Request) -> web.Response:
        await self._refresh_gauges()
        resp = web.Response(body=generate_latest())
        resp.content_type = CONTENT_TYPE_LATEST.split(";")[0]
        return resp

    async def _refresh_gauges(self) -> None:
        """Database-derived gauges, read at scrape time; a slow database leaves them stale."""
        try:
            assert self.pool is not None
            async with asyncio.timeout(1):
                metrics.INBOX_DEPTH.set(await inbox.depth(self.pool))
        except Exception as exc:
            log.debug("gauge refresh failed: %s", type(exc).__name__)
