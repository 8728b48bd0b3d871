"""The database a command uses: the one DATABASE_URL names, else the embedded server
(GATEWAY_EMBEDDED); waiting for it (and its schema) at start-up; one connection for an
operator command."""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from gateway.core.settings import Settings
from gateway.runtime.process import run
from gateway.runtime.startup import StartupError, wait_for_database, wait_for_schema
from gateway.store import sqlfiles
from gateway.store.db import connect


def resolve_database(settings: Settings) -> tuple[Settings, Any]:
    """Fill in ``database_url`` from the embedded server when it is unset (and allowed)."""
    if settings.database_url:
        return settings, None
    if not settings.embedded:
        raise StartupError(
            "DATABASE_URL is not set and GATEWAY_EMBEDDED=0: set DATABASE_URL to your PostgreSQL "
            "(or GATEWAY_EMBEDDED=1 for a throwaway embedded database)"
        )
    from gateway.runtime import embedded

    server, dsn = embedded.start(settings.data_dir)
    return dataclasses.replace(settings, database_url=dsn), server


async def wait_for(settings: Settings, *, schema: bool = False) -> None:
    """Wait (GATEWAY_DB_WAIT_S) for the database the settings name and, with ``schema`` where
    this process does not migrate itself (GATEWAY_MIGRATE_ON_START=false), for its schema."""
    assert settings.database_url
    lacking = sqlfiles.missing()
    if lacking:
        raise StartupError(
            f"this installation lacks {len(lacking)} of its SQL files (sql/): "
            f"{', '.join(lacking[:5])}; rebuild the image or reinstall the package"
        )
    dsn, timeout_s = settings.database_url, settings.db_connect_timeout_s
    await wait_for_database(dsn, wait_s=settings.db_wait_s, connect_timeout_s=timeout_s)
    if schema and not settings.migrate_on_start:
        await wait_for_schema(dsn, wait_s=settings.db_wait_s, connect_timeout_s=timeout_s)


def with_connection(settings: Settings, work: Callable[[asyncpg.Connection], Awaitable[int]]) -> int:
    """Operator commands: resolve the database, run ``work`` on one connection, close it."""
    settings, _server = resolve_database(settings)

    async def go() -> int:
        assert settings.database_url
        await wait_for(settings)
        conn = await connect(settings.database_url, timeout=settings.db_connect_timeout_s)
        try:
            return await work(conn)
        finally:
            await conn.close()

    return run(go())
