"""The start-up's schema probe (gateway.runtime.startup.wait_for_schema) against a real lock."""

from __future__ import annotations

import logging

import asyncpg
import pytest

from gateway.runtime.startup import StartupError, wait_for_schema
from gateway.store.db import MIGRATION_LOCK_ID, apply_functions
from gateway.store.sqlfiles import functions


async def test_siblings_probing_at_once_do_not_see_a_migration(
    db_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Processes of one start probe the migration lock together: one's probe, held for a
    moment, is no running migration to another (a clean start logs no warning)."""
    sibling = await asyncpg.connect(db_dsn)
    try:
        assert await sibling.fetchval("SELECT pg_try_advisory_lock_shared($1)", MIGRATION_LOCK_ID)
        with caplog.at_level(logging.WARNING, logger="gateway"):
            await wait_for_schema(db_dsn, wait_s=2, connect_timeout_s=5)
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    finally:
        await sibling.close()


async def test_a_migration_holding_its_lock_is_still_waited_for(db_dsn: str) -> None:
    migration = await asyncpg.connect(db_dsn)
    try:
        await migration.execute("SELECT pg_advisory_lock($1)", MIGRATION_LOCK_ID)
        with pytest.raises(StartupError, match="a migration still running"):
            await wait_for_schema(db_dsn, wait_s=0.5, connect_timeout_s=5)
    finally:
        await migration.close()


async def test_a_release_whose_functions_were_never_applied_waits_for_them(db_dsn: str) -> None:
    """Code that adds a function needs no migration of its own: at the same schema version, it
    starts once `gateway migrate` has applied the function, not before (its statements call it)."""
    conn = await asyncpg.connect(db_dsn)
    try:
        await conn.execute("DELETE FROM schema_functions WHERE name = 'inbox_pending_count'")
        await conn.execute("DROP FUNCTION inbox_pending_count(bigint)")
        with pytest.raises(StartupError, match="without the SQL functions inbox_pending_count after"):
            await wait_for_schema(db_dsn, wait_s=0.5, connect_timeout_s=5)
        assert await apply_functions(conn, functions()) == ["inbox_pending_count"]
        await wait_for_schema(db_dsn, wait_s=0.5, connect_timeout_s=5)
        assert await conn.fetchval("SELECT inbox_pending_count(10)") == 0
    finally:
        await conn.close()
