"""The one LISTEN loop every worker is woken by: NOTIFY calls back, a killed connection is
replaced (and the callback runs once more for what came meanwhile), a stop ends it."""

from __future__ import annotations

import asyncio
import functools

import asyncpg

from gateway.store.listen import listen, own_connection

GIVE_UP_S = 10  # a bound on the test, not a speed claim


async def _until(check: object) -> None:
    async with asyncio.timeout(GIVE_UP_S):
        while not await check():  # type: ignore[operator]
            await asyncio.sleep(0.02)


async def test_notify_wakes_and_a_killed_listener_comes_back(db_dsn: str, pool: asyncpg.Pool) -> None:
    calls: list[int] = []
    stop = asyncio.Event()
    task = asyncio.create_task(
        listen(functools.partial(own_connection, db_dsn, 5.0), "test_wake", lambda: calls.append(1), stop)
    )

    async def listeners() -> int:
        n: int = await pool.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'gateway LISTEN test_wake'"
        )
        return n

    async def called(n: int) -> bool:
        return len(calls) >= n

    try:
        await _until(lambda: called(1))  # once on connecting: rows may have come before
        await _until(lambda: listeners())
        await pool.execute("NOTIFY test_wake")
        await _until(lambda: called(2))
        await pool.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE application_name = 'gateway LISTEN test_wake'"
        )
        await _until(lambda: called(3))  # reconnected (after the first backoff step)
        await _until(lambda: listeners())
        await pool.execute("NOTIFY test_wake")
        await _until(lambda: called(4))
    finally:
        stop.set()
        await asyncio.wait_for(task, GIVE_UP_S)
    assert await listeners() == 0  # the connection is closed once stopped


async def test_an_unreachable_database_is_retried_until_stopped() -> None:
    calls: list[int] = []
    stop = asyncio.Event()
    dead = "postgresql://nobody@127.0.0.1:1/none"
    task = asyncio.create_task(
        listen(functools.partial(own_connection, dead, 1.0), "test_wake", lambda: calls.append(1), stop)
    )
    await asyncio.sleep(0.3)
    assert not task.done()  # failing, retrying: not crashed
    stop.set()
    await asyncio.wait_for(task, GIVE_UP_S)
    assert calls == []
