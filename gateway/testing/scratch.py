"""Throw-away databases for tests and benchmarks, on the server of an admin DSN."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg

from gateway.store.db import with_database


async def create_database(admin_dsn: str, name: str, template: str | None = None) -> str:
    clause = f' TEMPLATE "{template}"' if template else ""
    admin = await asyncpg.connect(admin_dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"{clause}')
    finally:
        await admin.close()
    return with_database(admin_dsn, name)


async def drop_database(admin_dsn: str, name: str) -> None:
    admin = await asyncpg.connect(admin_dsn)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


@asynccontextmanager
async def scratch_database(admin_dsn: str, prefix: str, template: str | None = None) -> AsyncIterator[str]:
    """A database named ``<prefix>_<random>`` for the duration of the block; its DSN."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    dsn = await create_database(admin_dsn, name, template)
    try:
        yield dsn
    finally:
        await drop_database(admin_dsn, name)
