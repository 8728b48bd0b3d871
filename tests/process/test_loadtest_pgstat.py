"""The cost of each statement in a benchmark's output: pg_stat_statements loaded on the
harness's own embedded PostgreSQL (a restart in place), read per phase; a server without it
(a DATABASE_URL one) is said to have none instead of failing the benchmark."""

from __future__ import annotations

from pathlib import Path

import asyncpg

from gateway.runtime import embedded
from loadtest.harness import database, pgstat


async def test_statements_are_counted_on_the_harness_s_own_server(pg_dir: Path) -> None:
    server, dsn = embedded.start(pg_dir, cleanup="delete")
    try:
        before = server.get_pid()
        database.load_statements(server)
        assert server.get_pid() != before  # restarted: the meters ask for the new postmaster
        assert await pgstat.reset(dsn)
        conn = await asyncpg.connect(dsn)
        try:
            for i in range(7):
                await conn.fetchval("SELECT $1::int + 1", i)
        finally:
            await conn.close()
        top = await pgstat.top(dsn)
        mine = next(s for s in top if "$1::int + $2" in s["query"] or "$1::int + 1" in s["query"])
        assert mine["calls"] == 7 and 0 < mine["share"] <= 1
        assert "SELECT $1::int" in pgstat.describe(top, per=7)
        assert await pgstat.reset(dsn)  # counting starts again
        assert all(s["calls"] <= 1 for s in await pgstat.top(dsn))
    finally:
        server.cleanup()


async def test_a_server_without_the_library_is_said_to_have_none(db_dsn: str) -> None:
    assert await pgstat.reset(db_dsn) is False
