"""Migrations: applied once, safely concurrent, and matching the schema snapshot."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from gateway.store.db import connect, latest_version, migrate, with_database
from gateway.store.sqlfiles import migrations
from tests.support.schema import describe

SNAPSHOT = Path(__file__).parent.parent / "schema_snapshot.txt"


@pytest.fixture
async def empty_db(pg_admin_dsn: str) -> AsyncIterator[str]:
    name = f"gw_m_{uuid.uuid4().hex[:10]}"
    admin = await asyncpg.connect(pg_admin_dsn)
    await admin.execute(f'CREATE DATABASE "{name}"')
    yield with_database(pg_admin_dsn, name)
    await admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
    await admin.close()


async def test_concurrent_migrators_apply_each_migration_once(empty_db: str) -> None:
    conns = [await connect(empty_db) for _ in range(4)]
    try:
        results = await asyncio.gather(*(migrate(c) for c in conns))
        applied = sorted(v for r in results for v in r)
        # Every migration applied by exactly one of the four migrators: none twice, none missed.
        assert applied == [m.version for m in migrations()]
        versions = [r["version"] for r in await conns[0].fetch("SELECT version FROM schema_migrations")]
        assert sorted(versions) == applied
        assert max(versions) == latest_version()
        assert await migrate(conns[0]) == []  # idempotent
    finally:
        for c in conns:
            await c.close()


async def test_schema_matches_snapshot(empty_db: str) -> None:
    conn = await connect(empty_db)
    try:
        await migrate(conn)
        actual = await describe(conn)
    finally:
        await conn.close()
    if os.environ.get("UPDATE_SNAPSHOT") == "1":
        SNAPSHOT.write_text(actual)
    assert SNAPSHOT.exists(), "run with UPDATE_SNAPSHOT=1 to create tests/schema_snapshot.txt"
    assert actual == SNAPSHOT.read_text(), "schema changed: review, then UPDATE_SNAPSHOT=1"
