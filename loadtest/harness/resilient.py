"""A database connection for the harness that survives the database going away: a run that
restarts PostgreSQL under load must not crash the tool that measures it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import asyncpg

from gateway.store.db import DB_ERRORS, connect

T = TypeVar("T")


class Db:
    """Connects on first use and again after any failure; ``call`` returns None while the
    database is unreachable instead of raising."""

    def __init__(self, dsn: str, timeout_s: float = 2.0) -> None:
        self.dsn = dsn
        self.timeout_s = timeout_s
        self._conn: asyncpg.Connection | None = None
        self.failures = 0

    async def _connection(self) -> asyncpg.Connection:
        if self._conn is None or self._conn.is_closed():
            self._conn = await connect(self.dsn, timeout=self.timeout_s)
        return self._conn

    async def call(self, fn: Callable[[asyncpg.Connection], Awaitable[T]]) -> T | None:
        try:
            async with asyncio.timeout(self.timeout_s * 2):
                return await fn(await self._connection())
        except DB_ERRORS:
            self.failures += 1
            await self._drop()
            return None

    async def wait(self, fn: Callable[[asyncpg.Connection], Awaitable[T]], timeout_s: float) -> T:
        """``call`` until it answers; TimeoutError after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            out = await self.call(fn)
            if out is not None:
                return out
            if time.monotonic() > deadline:
                raise TimeoutError(f"database unreachable for {timeout_s:.0f}s")
            await asyncio.sleep(0.5)

    async def connection(self, timeout_s: float = 60.0) -> asyncpg.Connection:
        """A live connection (waiting up to ``timeout_s`` for the database)."""

        async def ping(conn: asyncpg.Connection) -> asyncpg.Connection:
            await conn.fetchval("SELECT 1")
            return conn

        return await self.wait(ping, timeout_s)

    async def _drop(self) -> None:
        if self._conn is not None:
            self._conn.terminate()
            self._conn = None

    async def close(self) -> None:
        if self._conn is not None and not self._conn.is_closed():
            try:
                await self._conn.close(timeout=2)
            except DB_ERRORS:
                self._conn.terminate()
        self._conn = None
