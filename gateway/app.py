"""The aiohttp application: routes, and the resources it owns via ``cleanup_ctx``."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import asyncpg
from aiohttp import web

from gateway import consumer, health, ingest, send_api
from gateway.appkeys import COMMITTER, POOL, SETTINGS
from gateway.db import connect, create_pool, migrate_dsn
from gateway.groupcommit import GroupCommitter
from gateway.settings import Settings

log = logging.getLogger(__name__)


async def _database(app: web.Application) -> AsyncIterator[None]:
    s = app[SETTINGS]
    assert s.database_url, "database_url must be resolved before the app starts"
    if s.migrate_on_start:
        await migrate_dsn(s.database_url, timeout=s.db_connect_timeout_s)
    pool = await create_pool(s.database_url, s.db_pool_min, s.db_pool_max, timeout=s.db_connect_timeout_s)
    app[POOL] = pool
    yield
    await pool.close()


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
    yield
    await committer.close()


def build_app(settings: Settings, *, workers: bool = True) -> web.Application:
    """The gateway app; ``workers`` starts the in-process consumers and sender."""
    app = web.Application(client_max_size=settings.max_body_bytes)
    app[SETTINGS] = settings
    app.cleanup_ctx.append(_database)
    app.cleanup_ctx.append(_committer)
    ingest.add_routes(app)
    health.add_routes(app)
    send_api.add_routes(app)
    if not settings.meta_app_secrets:
        log.warning("GATEWAY_META_APP_SECRETS is empty: every Meta webhook POST will get 401")
    # Background workers, each owned by a cleanup_ctx so shutdown stops them in order.
    if workers and settings.run_consumers:
        app.cleanup_ctx.append(consumer.consumers_ctx)
    if workers and settings.run_sender:
        from gateway.sender import sender_ctx

        app.cleanup_ctx.append(sender_ctx)
    return app
