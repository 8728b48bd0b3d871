"""GATEWAY_TENANT_NUMBERS: a tenant sends only from the numbers bound to it."""

from __future__ import annotations

import logging
from typing import Any

import asyncpg
import orjson
import pytest
from aiohttp import ClientSession

from gateway.core.settings import Settings
from tests.support.config import replace
from tests.support.http import ACME, GLOBEX, post_message

# Also on a Citus cluster (make test-citus).
pytestmark = pytest.mark.citus


def body(number: str) -> bytes:
    return orjson.dumps(
        {"to": "4915112345678", "phone_number_id": number, "type": "text", "text": {"body": "x"}}
    )


@pytest.mark.parametrize(
    ("auth", "number", "status"),
    [
        (ACME, "1111", 202),
        (ACME, "2222", 403),
        (GLOBEX, "2222", 202),
        (GLOBEX, "1111", 403),
        (ACME, "3333", 202),
    ],
)
async def test_numbers_are_bound_to_tenants(
    auth: dict[str, str],
    number: str,
    status: int,
    http: ClientSession,
    start_gateway: Any,
    settings: Settings,
    pool: asyncpg.Pool,
) -> None:
    s = replace(settings, tenant_numbers=(("acme", "1111"), ("globex", "2222"), ("acme", "3333")))
    gw = await start_gateway(s)
    headers = {**auth, "Idempotency-Key": "k1"}
    async with http.post(gw.make_url("/v1/messages"), data=body(number), headers=headers) as r:
        assert r.status == status
        if status == 403:
            assert r.content_type == "application/problem+json"
            assert (await r.json())["status"] == 403
    assert await pool.fetchval("SELECT count(*) FROM outbox") == (status == 202)
    assert await pool.fetchval("SELECT count(*) FROM idempotency_keys WHERE state = 'done'") == (
        status == 202
    )


async def test_unset_binding_allows_any_number_and_warns(
    http: ClientSession, start_gateway: Any, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        gw = await start_gateway(settings)
    assert "GATEWAY_TENANT_NUMBERS is unset" in caplog.text
    assert (await post_message(http, gw, body("9999"), "k1", GLOBEX))[0] == 202
