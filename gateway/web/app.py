"""The aiohttp application: routes, the typed keys it holds, and the resources its requests
use, owned via ``cleanup_ctx`` (database pool, group committer, metrics listener). The
background services ``gateway serve`` runs beside it are attached by gateway.runtime.services."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import asyncpg
from aiohttp import web

from gateway.core.settings import Settings
from gateway.inbound.groupcommit import GroupCommitter
from gateway.inbound.webhooks import Webhooks
from gateway.outbound.enqueue_batch import EnqueueBatcher
from gateway.outbound.graph_api import GraphApi
from gateway.outbound.media_api import MediaApi
from gateway.outbound.outcomes import OutcomeWaiter, running
from gateway.outbound.send_api import SendApi
from gateway.outbound.wake import SenderWake
from gateway.store.db import connect, create_pool, migrate_dsn
from gateway.web import access
from gateway.web.health import HealthChecks, metrics_listener

log = logging.getLogger(__name__)

SETTINGS = web.AppKey("settings", Settings)
POOL = web.AppKey("pool", asyncpg.Pool)
COMMITTER = web.AppKey("committer", GroupCommitter)
WEBHOOKS = web.AppKey("webhooks", Webhooks)
SEND_API = web.AppKey("send_api", SendApi)
MEDIA_API = web.AppKey("media_api", MediaApi)
GRAPH_API = web.AppKey("graph_api", GraphApi)
SENDER_WAKE = web.AppKey("sender_wake", SenderWake)
HEALTH = web.AppKey("health", HealthChecks)


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
    app[SENDER_WAKE].connect = _own_connections(s)
    app[HEALTH].pool = pool
    # /readyz answers from a probe run once a second, not per request.
    async with app[HEALTH].probing():
        yield
    await app[SENDER_WAKE].close()
    await pool.close()


async def _outcomes(app: web.Application) -> AsyncIterator[None]:
    """The LISTEN the Graph-compatible endpoint's waiting requests are woken by."""
    async with running(app[GRAPH_API].waiter):
        yield


def _own_connections(s: Settings) -> Callable[[], Awaitable[asyncpg.Connection]]:
    """Connections outside the pool: a hot path that owns them pays no acquire, no reset, and
    busy consumers or senders cannot starve it."""
    dsn = s.database_url
    assert dsn

    async def connect_() -> asyncpg.Connection:
        return await connect(dsn, timeout=s.db_connect_timeout_s)

    return connect_


async def _enqueue_batcher(app: web.Application) -> AsyncIterator[None]:
    """Keyless Graph-compatible requests share INSERTs and COMMITs, on connections of their own."""
    batcher = EnqueueBatcher(_own_connections(app[SETTINGS]), app[SENDER_WAKE])
    enqueuer = app[GRAPH_API].enqueuer
    enqueuer.batch = batcher.enqueue
    yield
    enqueuer.batch = None
    await batcher.close()


async def _metrics_listener(app: web.Application) -> AsyncIterator[None]:
    """/metrics on its own port (GATEWAY_METRICS_PORT), away from the public webhook port."""
    s = app[SETTINGS]
    async with metrics_listener(s.host, s.metrics_port):
        yield


async def _committer(app: web.Application) -> AsyncIterator[None]:
    s = app[SETTINGS]
    committer = GroupCommitter(
        _own_connections(s),
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
    # Both send front ends wake the senders after their commits (this process's sender, when
    # gateway.runtime.services runs one here, else by NOTIFY).
    app[SENDER_WAKE] = SenderWake()
    app[SEND_API] = SendApi(settings, app[SENDER_WAKE])
    app[MEDIA_API] = MediaApi(settings)
    app[GRAPH_API] = GraphApi(settings, app[MEDIA_API], OutcomeWaiter(settings), app[SENDER_WAKE])
    app[HEALTH] = HealthChecks()
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
    app.cleanup_ctx.append(_enqueue_batcher)
    app.cleanup_ctx.append(_committer)
    if not settings.meta_app_secrets:
        log.warning("GATEWAY_META_APP_SECRETS is empty: every Meta webhook POST will get 401")
    if settings.api_keys and not settings.tenant_numbers:
        log.warning("GATEWAY_TENANT_NUMBERS is unset: any tenant may send from any phone_number_id")
    return app
