"""The last maintenance pass is recorded where operators look (the console's overview)."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from gateway.core.settings import Settings
from gateway.maintenance import jobs
from gateway.store import audit


async def test_a_pass_and_a_failed_pass_are_recorded(pool: asyncpg.Pool, settings: Settings) -> None:
    await jobs._retention(pool, settings, asyncio.Event())
    [ok] = await audit.passes(pool)
    assert ok.job == "retention" and ok.last_ok_at is not None and ok.last_failed_at is None
    # A pass that fails (here: a table it trims is gone) is recorded with its error; the
    # last good pass stays.
    await pool.execute("ALTER TABLE reply_claims RENAME TO reply_claims_away")
    with pytest.raises(asyncpg.UndefinedTableError):
        await jobs._retention(pool, settings, asyncio.Event())
    [failed] = await audit.passes(pool)
    assert failed.last_ok_at == ok.last_ok_at
    assert failed.last_failed_at is not None and "reply_claims" in (failed.last_error or "")
