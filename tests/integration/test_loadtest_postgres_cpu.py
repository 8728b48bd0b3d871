"""The benchmarks' CPU accounting of PostgreSQL: the server's processes found from a
connection, and the work of its backends charged to them."""

from __future__ import annotations

import uuid

import asyncpg
import pytest

from loadtest.harness import database
from loadtest.harness.cpu import CpuMeter, tree


async def test_the_work_of_a_local_servers_backends_is_charged_to_it(pool: asyncpg.Pool) -> None:
    async with pool.acquire() as conn:
        postmaster = await database.local_postmaster(conn)
        backend = await conn.fetchval("SELECT pg_backend_pid()")
        assert postmaster is not None and backend in tree(postmaster)
        meter = CpuMeter(0, None, groups=lambda: {"postgres": tree(postmaster)})
        meter.start()
        await conn.fetchval("SELECT sum(x) FROM generate_series(1, 3000000) x")
        assert meter.used()["postgres"] > 0.05


async def test_a_server_whose_data_directory_is_not_its_backends_parents_is_not_measured(
    pool: asyncpg.Pool,
) -> None:
    """As for a server on another machine, whose pids name unrelated processes here."""
    backend = await pool.fetchval("SELECT pg_backend_pid()")
    assert database._postmaster(backend, "/nonexistent/pgdata") is None
    assert database._postmaster(2**22 + 1, "/") is None  # no such process


async def test_a_role_that_may_not_read_the_data_directory_is_not_measured(
    pool: asyncpg.Pool, db_dsn: str
) -> None:
    role = f"lt_plain_{uuid.uuid4().hex[:8]}"
    await pool.execute(f"CREATE ROLE {role} LOGIN")
    try:
        conn = await asyncpg.connect(db_dsn, user=role)
        try:
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await conn.fetchval("SELECT current_setting('data_directory')")
            assert await database.local_postmaster(conn) is None
        finally:
            await conn.close()
    finally:
        await pool.execute(f"DROP ROLE {role}")
