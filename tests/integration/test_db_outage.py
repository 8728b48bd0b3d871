"""What the HTTP API answers while its database refuses connections: 503 problem+json, never a
500 with a traceback. The outage is real: the test database stops accepting connections and
every connection to it is terminated."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import asyncpg
import pytest
from aiohttp import ClientSession

from gateway.store.db import database_name
from gateway.testing.payloads import message_payload, meta_bytes
from gateway.web.server import Listening
from tests.support.http import ACME, post_meta


@pytest.fixture
async def outage(pg_admin_dsn: str, db_dsn: str) -> AsyncIterator[object]:
    """``await outage()`` makes the test database refuse connections until the test ends."""
    name = database_name(db_dsn)
    admin = await asyncpg.connect(pg_admin_dsn)

    async def start() -> None:
        await admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        await admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1", name)

    yield start
    await admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
    await admin.close()


async def test_message_state_with_the_database_down_is_503(
    http: ClientSession, gateway: Listening, outage: object, caplog: pytest.LogCaptureFixture
) -> None:
    url = gateway.make_url("/v1/messages/some-key")
    async with http.get(url, headers=ACME) as r:
        assert r.status == 404  # the database answers
    await outage()  # type: ignore[operator]
    for _ in range(3):  # the pool's dead connections first, then failed connects
        async with http.get(url, headers=ACME) as r:
            assert r.status == 503
            assert r.content_type == "application/problem+json"
            assert r.headers["Retry-After"]
    ours = [r for r in caplog.records if r.name.startswith(("gateway", "aiohttp"))]
    assert not [r for r in ours if r.levelno >= logging.ERROR or r.exc_info]


async def test_an_outage_logs_a_few_warnings_not_one_per_batch(
    http: ClientSession, gateway: Listening, outage: object, caplog: pytest.LogCaptureFixture
) -> None:
    await outage()  # type: ignore[operator]
    caplog.set_level(logging.WARNING)
    body = meta_bytes(message_payload("wamid.outage"))
    for _ in range(20):  # sequential: every request is a batch of its own, and every batch fails
        assert (await post_meta(http, gateway, body))[0] == 503
    lines = [r for r in caplog.records if r.name == "gateway.inbound.groupcommit"]
    assert len(lines) <= 1, [r.getMessage() for r in lines]


async def test_a_graph_compatible_send_with_the_database_down_is_metas_retryable_error(
    http: ClientSession, gateway: Listening, outage: object
) -> None:
    body = {"messaging_product": "whatsapp", "to": "4915112345678", "type": "text", "text": {"body": "hi"}}
    await outage()  # type: ignore[operator]
    for _ in range(3):
        async with http.post(gateway.make_url("/v23.0/1111/messages"), json=body, headers=ACME) as r:
            assert r.status == 503 and r.headers["Retry-After"]
            assert (await r.json())["error"]["code"] == 2  # Meta's "temporarily unavailable": retry
