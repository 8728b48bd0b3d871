"""Following the writable primary: a multi-host DSN whose first host accepts TCP and never
answers (a frozen or cut-off primary) still connects to the next one, and a server that takes
no writes is not ready and acknowledges nothing. (The full failover, on a real Patroni cluster:
tests/process/test_failover.py.)"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest
from aiohttp import ClientSession

from gateway.store import db
from gateway.store.db import connect_any, database_name
from gateway.testing.payloads import message_payload, meta_bytes
from gateway.web.server import Listening
from tests.support.http import post_meta

GIVE_UP_S = 10.0  # a bound on the test, not a claim about speed


@contextlib.asynccontextmanager
async def silent_host() -> AsyncIterator[int]:
    """A port that accepts connections and never says a word: a frozen server."""
    held: list[asyncio.StreamWriter] = []

    async def hold(_r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        held.append(w)

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        for w in held:
            w.close()
        server.close()


@contextlib.asynccontextmanager
async def tcp_to(socket_dir: str) -> AsyncIterator[int]:
    """The test server (on a Unix socket only) on a loopback TCP port: a second host."""
    (path,) = (p for p in Path(socket_dir).glob(".s.PGSQL.*") if not p.name.endswith(".lock"))

    async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while data := await r.read(65536):
                w.write(data)
                await w.drain()
        w.close()

    async def serve(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        pr, pw = await asyncio.open_unix_connection(str(path))
        await asyncio.gather(pipe(r, pw), pipe(pr, w))

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()


def multi_host(db_dsn: str, *ports: int) -> str:
    socket_dir = db_dsn.partition("?host=")[2]
    assert socket_dir, db_dsn
    hosts = ",".join(f"127.0.0.1:{p}" for p in ports)
    return f"postgresql://postgres@{hosts}/{database_name(db_dsn)}?target_session_attrs=read-write"


async def test_a_host_that_never_answers_does_not_hide_the_primary(db_dsn: str) -> None:
    socket_dir = db_dsn.partition("?host=")[2]
    seen: list[tuple[str, str]] = []
    db.observers.append(lambda event, detail: seen.append((event, detail)))
    try:
        async with silent_host() as frozen, tcp_to(socket_dir) as real:
            dsn = multi_host(db_dsn, frozen, real)
            # asyncpg's own multi-host connect spends its one timeout on the silent host.
            with pytest.raises(TimeoutError):
                await asyncpg.connect(dsn, timeout=1.0)
            async with asyncio.timeout(GIVE_UP_S):
                conn = await connect_any(dsn, timeout=1.0)
            try:
                assert await conn.fetchval("SELECT NOT pg_is_in_recovery()")
            finally:
                await conn.close()
            # Nothing writable anywhere: the hosts' error, and the observers are told.
            with pytest.raises(TimeoutError):
                await connect_any(multi_host(db_dsn, frozen), timeout=0.5)
            assert ("no_primary", "no host reachable") in seen
    finally:
        db.observers.pop()


async def test_a_standby_promoted_while_another_host_is_silent_is_found(db_dsn: str) -> None:
    """A failover from a frozen primary: the standby refuses (read-only) when first asked, is
    promoted while the frozen host still holds the attempt, and is asked again in time."""
    socket_dir = db_dsn.partition("?host=")[2]
    name = database_name(db_dsn)
    admin = await asyncpg.connect(db_dsn)
    try:
        await admin.execute(f'ALTER DATABASE "{name}" SET default_transaction_read_only = on')
        async with silent_host() as frozen, tcp_to(socket_dir) as standby:
            attempt = asyncio.create_task(connect_any(multi_host(db_dsn, frozen, standby), timeout=GIVE_UP_S))
            await asyncio.sleep(1.0)  # refused once at least
            assert not attempt.done()
            await admin.execute(f'ALTER DATABASE "{name}" RESET default_transaction_read_only')
            conn = await attempt  # before the silent host's timeout: it would raise then
            try:
                assert await conn.fetchval("SHOW default_transaction_read_only") == "off"
            finally:
                await conn.close()
    finally:
        await admin.execute(f'ALTER DATABASE "{name}" RESET default_transaction_read_only')
        await admin.close()


async def test_a_server_that_takes_no_writes_is_not_ready_and_acknowledges_nothing(
    http: ClientSession, gateway: Listening, db_dsn: str
) -> None:
    """As a demoted primary, or one set read-only, looks to the connections made to it."""
    admin = await asyncpg.connect(db_dsn)
    name = database_name(db_dsn)

    async def reconnect_everyone() -> None:
        await admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )

    async def ready_is(status: int) -> dict[str, str]:
        async with asyncio.timeout(GIVE_UP_S):
            while True:
                async with http.get(gateway.make_url("/readyz")) as r:
                    if r.status == status:
                        body: dict[str, str] = await r.json()
                        return body
                await asyncio.sleep(0.1)

    async def post_one() -> int:
        status, _ = await post_meta(http, gateway, meta_bytes(message_payload(f"wamid.{uuid.uuid4().hex}")))
        return status

    try:
        await ready_is(200)
        await admin.execute(f'ALTER DATABASE "{name}" SET default_transaction_read_only = on')
        await reconnect_everyone()
        body = await ready_is(503)
        assert body["reason"] in ("database: not a writable primary", "database: ConnectionDoesNotExistError")
        assert (await ready_is(503))["reason"] == "database: not a writable primary"
        assert await post_one() == 503
        assert await admin.fetchval("SELECT count(*) FROM webhook_inbox") == 0
        await admin.execute(f'ALTER DATABASE "{name}" RESET default_transaction_read_only')
        await reconnect_everyone()
        await ready_is(200)
        async with asyncio.timeout(GIVE_UP_S):
            while await post_one() != 200:  # the committer's first batch may meet a killed session
                await asyncio.sleep(0.1)
    finally:
        await admin.execute(f'ALTER DATABASE "{name}" RESET default_transaction_read_only')
        await admin.close()
