"""The load harness's payloads and raw client against a really started gateway."""

from __future__ import annotations

import asyncio

import asyncpg
from aiohttp import ClientSession
from aiohttp.test_utils import TestServer

from loadtest.harness.httpclient import Pool
from loadtest.harness.payloads import PayloadFactory
from tests.support.payloads import KINDS, SECRETS


async def test_gateway_accepts_every_kind_and_rejects_bad_signatures(
    gateway: TestServer, http: ClientSession, pool: asyncpg.Pool
) -> None:
    f = PayloadFactory(SECRETS, seed=11, run_tag="gw")
    good = [KINDS[k](f) for k in sorted(KINDS)]
    for d in good:
        async with http.post(gateway.make_url(d.path), data=d.body, headers=dict(d.headers)) as r:
            assert r.status == 200, (d.kind, await r.text())
    bad = [f.with_bad_signature(KINDS[k](f)) for k in ("inbound_text", "tenashi_status")]
    for d in bad:
        async with http.post(gateway.make_url(d.path), data=d.body, headers=dict(d.headers)) as r:
            assert r.status == 401
    stored = [r["body"] for r in await pool.fetch("SELECT body FROM webhook_inbox ORDER BY id")]
    assert stored == [d.body for d in good]  # byte for byte, nothing from the bad ones


async def test_raw_client_speaks_to_the_gateway(gateway: TestServer, pool: asyncpg.Pool) -> None:
    f = PayloadFactory(SECRETS, seed=12, run_tag="raw")
    ds = [f.inbound("text") for _ in range(20)] + [f.with_bad_signature(f.status())]
    client = Pool("127.0.0.1", gateway.port, max_connections=4)
    try:
        statuses = await asyncio.gather(*(client.request(d.wire) for d in ds))
    finally:
        client.close()
    assert statuses == [200] * 20 + [401]
    assert await pool.fetchval("SELECT count(*) FROM webhook_inbox") == 20
