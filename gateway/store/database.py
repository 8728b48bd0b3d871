"""The database as the HTTP side's objects hold it: one ``Database`` is handed to each of them
when it is built, and opened once the app starts (aiohttp fixes an app's routes, and so the
objects that serve them, before start-up; the pool needs the running event loop)."""

from __future__ import annotations

import asyncpg

from gateway.store.db import Pool, connect, create_pool


class Database:
    """A DSN, the pool opened on it while the app runs, and connections of their own for the
    hot paths that keep theirs (no acquire, no reset; busy consumers or senders cannot starve
    them)."""

    def __init__(self, dsn: str | None, *, connect_timeout_s: float = 5.0) -> None:
        self._dsn = dsn
        self._timeout = connect_timeout_s
        self._pool: Pool | None = None

    @property
    def pool(self) -> Pool:
        """The pool; only between ``open`` and ``close`` (the app's routes are served then)."""
        if self._pool is None:
            raise RuntimeError("the database is not open: served only while the app runs")
        return self._pool

    async def connect(self) -> asyncpg.Connection:
        """A connection outside the pool, to the writable primary of the moment."""
        if not self._dsn:
            raise RuntimeError("no database_url: it is resolved before the app is built")
        return await connect(self._dsn, timeout=self._timeout)

    async def open(self, min_size: int, max_size: int) -> Pool:
        if not self._dsn:
            raise RuntimeError("no database_url: it is resolved before the app is built")
        self._pool = await create_pool(self._dsn, min_size, max_size, timeout=self._timeout)
        return self._pool

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()
