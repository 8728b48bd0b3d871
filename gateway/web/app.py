"""The aiohttp application: routes, the typed keys it holds, and the resources its requests
use, owned via ``cleanup_ctx`` (database pool, group committer, metrics listener). The
background services ``gateway serve`` runs beside it are attached by gateway.runtime.services."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import asyncpg
from aiohttp import web

from gateway.core.settings import Settings
from gateway.inbound.groupcommit import GroupCommitter
from gateway.inbound.webhooks import Webhooks
from gateway.outbound.graph_api import GraphApi
from gateway.outbound.media_api import MediaApi
from gateway.outbound.outcomes import OutcomeWaiter, running
from gateway.outbound.send_api import SendApi
from gateway.store.db import connect, create_pool, migrate_dsn
from gateway.web import access
from gateway.web.health import Health, metrics_listener

log = logging.getLogger(__name__)

SETTINGS = web.AppKey("settings", Settings)
POOL = web.AppKey("pool", asyncpg.Pool)
COMMITTER = web.AppKey("committer", GroupCommitter)
WEBHOOKS = web.AppKey("webhooks", Webhooks)
SEND_API = web.AppKey("send_api", SendApi)
MEDIA_API = web.AppKey("media_api", MediaApi)
GRAPH_API = web.AppKey("graph_api", GraphApi)
HEALTH = web.AppKey("health", Health)


async def _database(app: web.Application) -> AsyncIterator[None]:
    s = app[SETTINGS]
    assert s.database_url, "database_url must be resolved before the app starts"
    if s.migrate_on_start:
        await migrate_dsn(s.database_url, timeout=s.db_connect_timeout_s)
    pool = await create_pool(s.database_url, s.db_pool_min, s.db_pool_max, timeout=s.db_connect_timeout_s)
    app[POOL] = pool
    app[SEND_API].pool = pool
    app[MEDIA_API].pool = pool
    app[GRAPH_API].pool = pool
    app[HEALTH].pool = pool
    # /readyz answers from a probe run once a second, not per request.
    async with app[HEALTH].probing():
        yield
    await pool.close()


async def _outcomes(app: web.Application) -> AsyncIterator[None]:
    """The LISTEN the Graph-compatible endpoint's waiting requests are woken by."""
    async with running(app[GRAPH_API].waiter):
        yield


async def _metrics_listener(app: web.Application) -> AsyncIterator[None]:
    """/metrics on its own port (GATEWAY_METRICS_PORT), away from the public webhook port."""
    s = app[SETTINGS]
    async with metrics_listener(s.host, s.metrics_port):
        yield


async def _committer(app: web.Application) -> AsyncIterator[None]:
    s = app[SETTINGS]
    dsn = s.database_url
    assert dsn

    # The ack path gets its own connections: busy consumers or senders can't starve it.
    async def connect_() -> asyncpg.Connection:
        return await connect(dsn, timeout=s.db_connect_timeout_s)

    committer = GroupCommitter(
        connect_,
        window_s=s.commit_window_ms / 1000,
        max_batch=s.commit_max_batch,
        max_inflight=s.commit_max_inflight,
        deadline_s=s.ack_deadline_ms / 1000,
    )
    app[COMMITTER] = committer
    app[WEBHOOKS].committer = committer
    yield
    app[WEBHOOKS].committer = None
    await committer.close()


def build_app(settings: Settings) -> web.Application:
    """The gateway's HTTP side: webhooks, send API, health and metrics."""
    # One middleware: access log, request id, and raised errors answered as problem documents.
    app = web.Application(
        client_max_size=settings.max_body_bytes, middlewares=[access.middleware(settings.access_log_rate)]
    )
    app[SETTINGS] = settings
    app[WEBHOOKS] = Webhooks(settings)
    app[SEND_API] = SendApi(settings)
    app[MEDIA_API] = MediaApi(settings)
    app[GRAPH_API] = GraphApi(settings, app[MEDIA_API], OutcomeWaiter(settings))
    app[HEALTH] = Health()
    app.router.add_routes(app[WEBHOOKS].routes())
    # /metrics names destinations and phone-number ids: never on the public port unless asked for.
    app.router.add_routes(app[HEALTH].routes(metrics=settings.metrics_public))
    app.router.add_routes(app[SEND_API].routes())
    app.router.add_routes(app[MEDIA_API].routes())
    # Last: its paths (/{version}/...) take only what no other route matched.
    app.router.add_routes(app[GRAPH_API].routes())
    app.on_cleanup.append(app[MEDIA_API].close)
    if settings.metrics_port and not settings.metrics_public:
        app.cleanup_ctx.append(_metrics_listener)
    app.cleanup_ctx.append(_database)
    app.cleanup_ctx.append(_outcomes)
    app.cleanup_ctx.append(_committer)
    if not settings.meta_app_secrets:
        log.warning("GATEWAY_META_APP_SECRETS is empty: every Meta webhook POST will get 401")
    if settings.api_keys and not settings.tenant_numbers:
        log.warning("GATEWAY_TENANT_NUMBERS is unset: any tenant may send from any phone_number_id")
    return app
