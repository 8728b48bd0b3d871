"""The aiohttp application: routes, the typed keys it holds, and the resources its requests
use. Each object that serves requests is built with what it uses (the ``Database``, the group
committer, the senders' wake-up); the ``cleanup_ctx`` steps open and close those resources
(database pool, committer, enqueue batcher, metrics listener), never patch the objects. The
background services ``gateway serve`` runs beside it are attached by gateway.runtime.services."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

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
from gateway.store.database import Database
from gateway.store.db import migrate_dsn
from gateway.web import access
from gateway.web.health import HealthChecks, metrics_listener

log = logging.getLogger(__name__)

SETTINGS = web.AppKey("settings", Settings)
DATABASE = web.AppKey("database", Database)
POOL = web.AppKey("pool", asyncpg.Pool)
COMMITTER = web.AppKey("committer", GroupCommitter)
WEBHOOKS = web.AppKey("webhooks", Webhooks)
SEND_API = web.AppKey("send_api", SendApi)
MEDIA_API = web.AppKey("media_api", MediaApi)
GRAPH_API = web.AppKey("graph_api", GraphApi)
SENDER_WAKE = web.AppKey("sender_wake", SenderWake)
HEALTH = web.AppKey("health", HealthChecks)
ENQUEUE_BATCHER = web.AppKey("enqueue_batcher", EnqueueBatcher)


async def _database(app: web.Application) -> AsyncIterator[None]:
    s = app[SETTINGS]
    assert s.database_url, "database_url must be resolved before the app starts"
    if s.migrate_on_start:
        await migrate_dsn(s.database_url, timeout=s.db_connect_timeout_s)
    app[POOL] = await app[DATABASE].open(s.db_pool_min, s.db_pool_max)
    # /readyz answers from a probe run once a second, not per request.
    async with app[HEALTH].probing():
        yield
    await app[SENDER_WAKE].close()
    await app[DATABASE].close()


async def _outcomes(app: web.Application) -> AsyncIterator[None]:
    """The LISTEN the Graph-compatible endpoint's waiting requests are woken by."""
    async with running(app[GRAPH_API].waiter):
        yield


async def _enqueue_batcher(app: web.Application) -> AsyncIterator[None]:
    """At shutdown, the batches under way are committed and its connections closed."""
    yield
    await app[ENQUEUE_BATCHER].close()


async def _metrics_listener(app: web.Application) -> AsyncIterator[None]:
    """/metrics on its own port (GATEWAY_METRICS_PORT), away from the public webhook port."""
    s = app[SETTINGS]
    async with metrics_listener(s.host, s.metrics_port):
        yield


async def _committer(app: web.Application) -> AsyncIterator[None]:
    """At shutdown, what is staged is committed (or answered 503) and its connections closed."""
    yield
    await app[COMMITTER].close()


def build_app(settings: Settings) -> web.Application:
    """The gateway's HTTP side: webhooks, send API, health and metrics."""
    # One middleware: access log, request id, and raised errors answered as problem documents.
    app = web.Application(
        client_max_size=settings.max_body_bytes, middlewares=[access.middleware(settings.access_log_rate)]
    )
    app[SETTINGS] = settings
    # Opened by _database once the app starts; the hot paths below own connections of their
    # own besides (Database.connect): no acquire, no reset, no starving behind the pool's users.
    db = app[DATABASE] = Database(settings.database_url, connect_timeout_s=settings.db_connect_timeout_s)
    app[COMMITTER] = GroupCommitter(
        db.connect,
        window_s=settings.commit_window_ms / 1000,
        linger_s=settings.commit_linger_ms / 1000,
        linger_gather=settings.commit_linger_gather,
        max_batch=settings.commit_max_batch,
        max_inflight=settings.commit_max_inflight,
        deadline_s=settings.ack_deadline_ms / 1000,
    )
    app[WEBHOOKS] = Webhooks(settings, app[COMMITTER])
    # Both send front ends wake the senders after their commits (this process's sender, when
    # gateway.runtime.services runs one here, else by NOTIFY).
    wake = app[SENDER_WAKE] = SenderWake(db.connect)
    # Keyless Graph-compatible requests share INSERTs and COMMITs.
    app[ENQUEUE_BATCHER] = EnqueueBatcher(db.connect, wake)
    app[SEND_API] = SendApi(settings, db, wake)
    app[MEDIA_API] = MediaApi(settings, db)
    app[GRAPH_API] = GraphApi(
        settings, db, app[MEDIA_API], OutcomeWaiter(settings), wake, app[ENQUEUE_BATCHER].enqueue
    )
    app[HEALTH] = HealthChecks(db)
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
