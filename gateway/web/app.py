"""The aiohttp application: routes, the typed keys it holds, and every resource it owns via
``cleanup_ctx`` (database pool, group committer, consumers, sender, forwarder, maintenance jobs)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import asyncpg
from aiohttp import web

from gateway.core.settings import Settings
from gateway.inbound.consumer_group import ConsumerGroup
from gateway.inbound.groupcommit import GroupCommitter
from gateway.inbound.webhooks import Webhooks
from gateway.maintenance import jobs
from gateway.outbound.forwarder import Forwarder
from gateway.outbound.media_api import MediaApi
from gateway.outbound.send_api import SendApi
from gateway.outbound.sender import Sender
from gateway.store.db import connect, create_pool, migrate_dsn
from gateway.web import access
from gateway.web.health import Health, metrics_listener

log = logging.getLogger(__name__)

SETTINGS = web.AppKey("settings", Settings)
POOL = web.AppKey("pool", asyncpg.Pool)
COMMITTER = web.AppKey("committer", GroupCommitter)
CONSUMERS = web.AppKey("consumers", ConsumerGroup)
SENDER = web.AppKey("sender", Sender)
FORWARDER = web.AppKey("forwarder", Forwarder)
WEBHOOKS = web.AppKey("webhooks", Webhooks)
SEND_API = web.AppKey("send_api", SendApi)
MEDIA_API = web.AppKey("media_api", MediaApi)
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
    app[HEALTH].pool = pool
    # /readyz answers from a probe run once a second, not per request.
    async with app[HEALTH].probing():
        yield
    await pool.close()


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


async def _consumers(app: web.Application) -> AsyncIterator[None]:
    """The consumers run for the app's lifetime, on the app's pool."""
    group = ConsumerGroup(app[POOL], app[SETTINGS])
    app[CONSUMERS] = group
    await group.start()
    yield
    await group.stop()


async def _sender(app: web.Application) -> AsyncIterator[None]:
    """The sender runs beside the HTTP server."""
    sender = Sender(app[POOL], app[SETTINGS])
    app[SENDER] = sender
    stop = asyncio.Event()
    task = asyncio.create_task(sender.run(stop))
    yield
    stop.set()
    try:
        await asyncio.wait_for(task, sender.timeout.total or 30)
    except TimeoutError:
        log.warning("sender did not stop in time; rows it was sending become unknown after the lease")
    await sender.close()


async def _forwarder(app: web.Application) -> AsyncIterator[None]:
    """The forwarder (deliveries → downstream destinations) runs beside the HTTP server."""
    forwarder = Forwarder(app[POOL], app[SETTINGS])
    app[FORWARDER] = forwarder
    if CONSUMERS in app:  # in-process consumers wake it directly after their commits
        app[CONSUMERS].on_deliveries(forwarder.wake.set)
    stop = asyncio.Event()
    task = asyncio.create_task(forwarder.run(stop))
    yield
    stop.set()
    await task  # bounded: in-flight requests get a short grace, then their leases cover them
    await forwarder.close()


def _maintenance(inbound: bool, outbound: bool, forward: bool = False) -> object:
    async def ctx(app: web.Application) -> AsyncIterator[None]:
        stop = asyncio.Event()
        task = asyncio.create_task(
            jobs.run(
                jobs.jobs_for(app[POOL], app[SETTINGS], inbound=inbound, outbound=outbound, forward=forward),
                stop,
            )
        )
        yield
        stop.set()
        await task

    return ctx


def build_app(settings: Settings, *, workers: bool = True) -> web.Application:
    """The gateway app; ``workers`` starts the in-process consumers, sender and forwarder."""
    # One middleware: access log, request id, and raised errors answered as problem documents.
    app = web.Application(
        client_max_size=settings.max_body_bytes, middlewares=[access.middleware(settings.access_log_rate)]
    )
    app[SETTINGS] = settings
    app[WEBHOOKS] = Webhooks(settings)
    app[SEND_API] = SendApi(settings)
    app[MEDIA_API] = MediaApi(settings)
    app[HEALTH] = Health()
    app.router.add_routes(app[WEBHOOKS].routes())
    app.router.add_routes(app[HEALTH].routes(metrics=not settings.metrics_port))
    app.router.add_routes(app[SEND_API].routes())
    app.router.add_routes(app[MEDIA_API].routes())
    app.on_cleanup.append(app[MEDIA_API].close)
    if settings.metrics_port:
        app.cleanup_ctx.append(_metrics_listener)
    app.cleanup_ctx.append(_database)
    app.cleanup_ctx.append(_committer)
    if not settings.meta_app_secrets:
        log.warning("GATEWAY_META_APP_SECRETS is empty: every Meta webhook POST will get 401")
    if settings.api_keys and not settings.tenant_numbers:
        log.warning("GATEWAY_TENANT_NUMBERS is unset: any tenant may send from any phone_number_id")
    # Background workers, each owned by a cleanup_ctx so shutdown stops them in order.
    inbound = workers and settings.run_consumers
    outbound = workers and settings.run_sender
    forward = workers and settings.run_forwarder
    if inbound:
        app.cleanup_ctx.append(_consumers)
    if outbound:
        app.cleanup_ctx.append(_sender)
    if forward:
        app.cleanup_ctx.append(_forwarder)
    if inbound or outbound or forward:
        app.cleanup_ctx.append(_maintenance(inbound, outbound, forward))  # type: ignore[arg-type]
    return app
