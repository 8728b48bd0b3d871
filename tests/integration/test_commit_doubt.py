"""A staging batch whose COMMIT the server confirmed while warning that a participant's may
have failed (Citus's ``failed to commit transaction on host:port``, gateway.store.doubt) is
answered as one whose connection was lost during COMMIT: 503, never 200. Here a trigger's
WARNING stands in for the coordinator's (tests/citus/test_commit_doubt.py makes the real one)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from functools import partial
from typing import Any

import asyncpg
import pytest

from gateway.inbound.groupcommit import GroupCommitter, Unavailable
from gateway.store.db import connect

DOUBT = "failed to commit transaction on 10.0.0.7:5432"


@pytest.fixture
async def warn_on(pool: asyncpg.Pool) -> AsyncIterator[Any]:
    """``await warn_on(table, message)``: every INSERT into ``table`` warns ``message``."""
    made: list[str] = []

    async def install(table: str, message: str) -> None:
        await pool.execute(
            "CREATE OR REPLACE FUNCTION probe_warn() RETURNS trigger LANGUAGE plpgsql AS "
            f"$$ BEGIN RAISE WARNING '{message}'; RETURN NULL; END $$"
        )
        await pool.execute(
            f"CREATE TRIGGER probe AFTER INSERT ON {table} FOR EACH STATEMENT EXECUTE FUNCTION probe_warn()"
        )
        made.append(table)

    yield install
    for table in made:
        await pool.execute(f"DROP TRIGGER IF EXISTS probe ON {table}")
    await pool.execute("DROP FUNCTION IF EXISTS probe_warn()")


@pytest.mark.parametrize(("warning", "answered"), [("a warning that means nothing", True), (DOUBT, False)])
async def test_a_staging_batch_in_doubt_is_not_acknowledged(
    pool: asyncpg.Pool, db_dsn: str, warn_on: Any, warning: str, answered: bool
) -> None:
    await warn_on("webhook_inbox", warning)
    gc = GroupCommitter(partial(connect, db_dsn), window_s=0.001)
    try:
        futs = [gc.stage("meta", b"warned%d" % i) for i in range(3)]
        done = await asyncio.wait_for(asyncio.gather(*futs, return_exceptions=True), 5)
        if answered:
            assert done == [None] * 3
        else:
            assert all(isinstance(r, Unavailable) for r in done), done
        # The next batch, on a new connection, is judged by its own notices.
        await pool.execute("DROP TRIGGER probe ON webhook_inbox")
        await asyncio.wait_for(gc.stage("meta", b"after"), 5)
    finally:
        await gc.close()

