"""/healthz (process up), /readyz (database reachable, schema current), /metrics."""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gateway import metrics
from gateway.appkeys import POOL
from gateway.db import latest_version
from gateway.sqlfiles import q

log = logging.getLogger(__name__)


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    pool = request.app[POOL]
    try:
        async with asyncio.timeout(2):
            version = await pool.fetchval(q("ready_check"))
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


async def metrics_view(request: web.Request) -> web.Response:
    await refresh_gauges(request.app)
    resp = web.Response(body=generate_latest())
    resp.content_type = CONTENT_TYPE_LATEST.split(";")[0]
    return resp


async def refresh_gauges(app: web.Application) -> None:
    """Database-derived gauges, read at scrape time; a slow database leaves them stale."""
    pool = app[POOL]
    try:
        async with asyncio.timeout(1):
            metrics.INBOX_DEPTH.set(await pool.fetchval(q("inbox_depth")))
    except Exception as exc:
        log.debug("gauge refresh failed: %s", type(exc).__name__)


def add_routes(app: web.Application) -> None:
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_view)
