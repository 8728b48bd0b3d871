"""The background services of a process, wired in one place.

A service is a long-running part of a process beside (or instead of) the HTTP server: the
consumer group, the sender, the forwarder and the maintenance jobs. Each has the same
lifecycle: ``run(stop)`` until ``stop`` is set, then ``close()`` for what it holds. After
``stop`` a service gets ``stop_grace_s`` to finish what it is doing (None: it bounds its own
shutdown), then it is cancelled.

``gateway serve`` runs them inside its app (``attach``: one ``cleanup_ctx``); ``gateway
consume|send|forward`` run one of them as the whole process (``gateway.runtime.serve.run_services``).
Both build them here, with ``build``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import asyncpg
from aiohttp import web

from gateway.core.settings import Settings
from gateway.inbound.consumer_group import ConsumerGroup
from gateway.maintenance.jobs import Maintenance
from gateway.outbound.forwarder import Forwarder
from gateway.outbound.sender import Sender
from gateway.outbound.wake import ForwarderWake
from gateway.web.app import POOL, SENDER_WAKE, SETTINGS, build_app

log = logging.getLogger("gateway")


class Service(Protocol):
    name: str

    @property
    def stop_grace_s(self) -> float | None: ...

    async def run(self, stop: asyncio.Event) -> None: ...

    async def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Roles:
    """Which services a process runs (the maintenance jobs follow from them)."""

    consumers: bool = False
    sender: bool = False
    forwarder: bool = False

    @classmethod
    def of_serve(cls, settings: Settings) -> Roles:
        return cls(settings.run_consumers, settings.run_sender, settings.run_forwarder)

    def __bool__(self) -> bool:
        return self.consumers or self.sender or self.forwarder


@dataclass(slots=True)
class Services:
    """The services of one process, in start order (stopped together, closed in reverse)."""

    consumers: ConsumerGroup | None = None
    sender: Sender | None = None
    forwarder: Forwarder | None = None
    maintenance: Maintenance | None = None
    failed: list[str] = field(default_factory=list)  # the names of those that stopped on their own

    def all(self) -> list[Service]:
        found = (self.consumers, self.sender, self.forwarder, self.maintenance)
        return [s for s in found if s is not None]


def build(pool: asyncpg.Pool, settings: Settings, roles: Roles) -> Services:
    """The services ``roles`` asks for, on ``pool``. In-process consumers wake an in-process
    forwarder right after their commits (other processes' forwarders wake on NOTIFY: the
    trigger's, or on a Citus coordinator ForwarderWake's)."""
    out = Services()
    if roles.forwarder:
        out.forwarder = Forwarder(pool, settings)
    if roles.consumers:
        f = out.forwarder
        wake = ForwarderWake(pool) if f is None else ForwarderWake(pool, f.kick, f.token)
        out.consumers = ConsumerGroup(pool, settings, on_deliveries=wake, woken=wake.woken)
    if roles.sender:
        out.sender = Sender(pool, settings)
    if roles:
        out.maintenance = Maintenance(
            pool, settings, inbound=roles.consumers, outbound=roles.sender, forward=roles.forwarder
        )
    return out


def pool_size(settings: Settings, roles: Roles) -> tuple[int, int]:
    """Connections for a process that runs only ``roles`` (no HTTP server)."""
    if roles.sender:
        return settings.db_pool_min, settings.db_pool_max
    if roles.consumers:
        return 1, settings.consumer_concurrency + 3
    return 1, 4


async def run(
    services: Sequence[Service], stop: asyncio.Event, on_failure: Callable[[], None] | None = None
) -> list[str]:
    """Run ``services`` until ``stop`` is set; each then gets its grace before it is cancelled,
    and all are closed, in reverse order. A service whose ``run`` ends before ``stop`` is
    logged and ``on_failure`` is called. Returns the names of those that failed."""
    tasks: dict[asyncio.Task[Any], Service] = {asyncio.create_task(s.run(stop)): s for s in services}
    failed: list[asyncio.Task[Any]] = []
    stopping: asyncio.Task[Any] = asyncio.create_task(stop.wait())
    try:
        while not stop.is_set() and len(failed) < len(tasks):
            running = [t for t in tasks if t not in failed]
            done, _ = await asyncio.wait([*running, stopping], return_when=asyncio.FIRST_COMPLETED)
            if stop.is_set():
                break  # what ended with the stop is seen to below
            for t in done:
                failed.append(t)
                exc = None if t.cancelled() else t.exception()
                log.error("%s stopped on its own", tasks[t].name, exc_info=exc)
                if on_failure is not None:
                    on_failure()
        await asyncio.gather(*(_finish(s, t) for t, s in tasks.items() if t not in failed))
    finally:
        stopping.cancel()
        for t in tasks:
            t.cancel()
        await asyncio.gather(stopping, *tasks, return_exceptions=True)
        for s in reversed(services):
            try:
                await s.close()
            except Exception as exc:
                log.warning("%s: close failed: %s: %s", s.name, type(exc).__name__, exc)
    return [tasks[t].name for t in failed]


async def _finish(s: Service, task: asyncio.Task[Any]) -> None:
    """Wait for a stopped service to finish, at most its grace; then cancel it."""
    try:
        await asyncio.wait_for(asyncio.shield(task), s.stop_grace_s)
    except TimeoutError:
        log.warning("%s did not stop within %.0f s: cancelled", s.name, s.stop_grace_s or 0)
        task.cancel()
    except asyncio.CancelledError:
        if not task.cancelled():
            raise
    except Exception:
        log.exception("%s failed while stopping", s.name)


@contextlib.asynccontextmanager
async def running(*services: Service) -> AsyncIterator[None]:
    """Run ``services`` for the duration of the block; stopped, finished and closed after it
    (tests and benchmarks)."""
    stop = asyncio.Event()
    task = asyncio.create_task(run(services, stop))
    try:
        yield
    finally:
        stop.set()
        await task


SERVICES = web.AppKey("services", Services)


def attach(app: web.Application, on_failure: Callable[[], None] | None = None) -> web.Application:
    """Run the services ``gateway serve`` runs (GATEWAY_RUN_*) for the app's lifetime, on its
    pool: one ``cleanup_ctx``, after the pool's and the group committer's."""
    roles = Roles.of_serve(app[SETTINGS])
    if not roles:
        return app

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        services = build(app[POOL], app[SETTINGS], roles)
        app[SERVICES] = services
        # The send front ends wake this sender directly after their commits.
        detach = app[SENDER_WAKE].attach(services.sender.wake) if services.sender is not None else None
        stop = asyncio.Event()
        task = asyncio.create_task(run(services.all(), stop, on_failure))
        yield
        if detach is not None:
            detach()
        stop.set()
        services.failed = await task

    app.cleanup_ctx.append(ctx)
    return app


def gateway_app(settings: Settings, on_failure: Callable[[], None] | None = None) -> web.Application:
    """The app of ``gateway serve``: the HTTP side (gateway.web.app) and its services."""
    return attach(build_app(settings), on_failure)
