"""bench-pipeline --aged: a database given the day partitions its retention keeps."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import asyncpg

from gateway.core.settings import Settings
from gateway.maintenance.retention import partitioned
from gateway.store import retention
from loadtest.harness import database


async def test_age_gives_every_partitioned_table_its_retention_of_days(
    db_dsn: str, pool: asyncpg.Pool
) -> None:
    before = {p.table: len(await retention.days(pool, table=p.table)) for p in partitioned(Settings())}
    counts = await database.age(db_dsn)
    today = datetime.now(UTC).date()
    for p in partitioned(Settings()):
        days = await retention.days(pool, table=p.table)
        assert counts[p.table] == len(days) > before[p.table]
        # every day back to the horizon, none past it (retention would drop it at once)
        assert {today - timedelta(days=n) for n in range(p.keep_days + 1)} <= set(days), p.table
        assert min(days) == today - timedelta(days=p.keep_days), p.table
    assert await database.age(db_dsn) == counts  # once is enough
