"""The ingest edge through the real HTTP server against a real PostgreSQL."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import asyncpg
import pytest
from aiohttp import ClientSession
from aiohttp.test_utils import TestServer

from gateway import metrics
from gateway.core.settings import Settings
from gateway.core.signature import sign_meta, sign_tenashi
from gateway.store.db import database_name
from gateway.testing.payloads import message_payload, meta_bytes
from gateway.web.app import COMMITTER
from tests.support.config import (
    META_OLD_SECRET,
    META_SECRET,
    TENASHI_SECRET,
    VERIFY_TOKEN,
    public_metrics,
    replace,
)
from tests.support.http import post_meta


async def inbox_bodies(pool: asyncpg.Pool) -> list[bytes]:
    return [r["body"] for r in await pool.fetch("SELECT body FROM webhook_inbox ORDER BY id")]


@pytest.mark.parametrize(
    ("query", "status", "body"),
    [
        (
            {"hub.mode": "subscribe", "hub.verify_token": VERIFY_TOKEN, "hub.challenge": "1158201444"},
            200,
            "1158201444",
        ),
        ({"hub.mode": "subscribe", "hub.verify_token": "wrong", "hub.challenge": "1158201444"}, 403, None),
        ({"hub.mode": "unsubscribe", "hub.verify_token": VERIFY_TOKEN, "hub.challenge": "x"}, 403, None),
        ({"hub.mode": "subscribe", "hub.challenge": "x"}, 403, None),
    ],
)
async def test_verification_handshake(
    http: ClientSession, gateway: TestServer, query: dict[str, str], status: int, body: str | None
) -> None:
    async with http.get(gateway.make_url("/webhooks/meta"), params=query) as r:
        assert r.status == status
        if body is not None:
            assert await r.text() == body


@pytest.mark.citus
async def test_signed_payload_is_stored_byte_for_byte(
    http: ClientSession, gateway: TestServer, pool: asyncpg.Pool
) -> None:
    # Meta escapes non-ASCII (\u00e4), may escape '/', and sends an emoji as a surrogate pair.
    payload = message_payload("wamid.HBgL=", text="Grüße / ok 😀 https://x.y/z")
    body = meta_bytes(payload, escape_slash=True)
    assert b"\\u00fc" in body and b"\\/" in body and b"\\ud83d\\ude00" in body
    status, _ = await post_meta(http, gateway, body, sign_meta(body, META_SECRET))
    assert status == 200
    assert await inbox_bodies(pool) == [body]
    row = await pool.fetchrow(
        "SELECT w.source, s.state, w.delivery_id"
        " FROM webhook_inbox w JOIN inbox_row_states() s ON s.id = w.id"
    )
    assert dict(row) == {"source": "meta", "state": "pending", "delivery_id": None}


@pytest.mark.parametrize(
    "case",
    ["tampered", "wrong_secret", "missing", "malformed_prefix", "malformed_hex", "short", "empty"],
)
async def test_bad_signatures_are_refused_and_nothing_stored(
    http: ClientSession, gateway: TestServer, pool: asyncpg.Pool, case: str
) -> None:
    body = meta_bytes(message_payload("wamid.bad"))
    good = sign_meta(body, META_SECRET)
    send_body, sig = {
        "tampered": (body.replace(b"hi", b"ho"), good),
        "wrong_secret": (body, sign_meta(body, "not-the-secret")),
        "missing": (body, None),
        "malformed_prefix": (body, good.replace("sha256=", "sha1=")),
        "malformed_hex": (body, "sha256=" + "zz" * 32),
        "short": (body, good[:-2]),
        "empty": (body, ""),
    }[case]
    status, text = await post_meta(http, gateway, send_body, sig)
    assert status == 401
    assert "X-Hub-Signature-256" in text
    assert await inbox_bodies(pool) == []


@pytest.mark.citus
async def test_rotation_accepts_old_and_new_secret(
    http: ClientSession, gateway: TestServer, pool: asyncpg.Pool
) -> None:
    a = meta_bytes(message_payload("wamid.new"))
    b = meta_bytes(message_payload("wamid.old"))
    assert (await post_meta(http, gateway, a, sign_meta(a, META_SECRET)))[0] == 200
    assert (await post_meta(http, gateway, b, sign_meta(b, META_OLD_SECRET)))[0] == 200
    assert await inbox_bodies(pool) == [a, b]


async def test_three_megabyte_payload_accepted_and_oversize_refused(
    http: ClientSession, start_gateway: object, settings: Settings, pool: asyncpg.Pool
) -> None:
    limit = 4 * 1024 * 1024
    server = await start_gateway(replace(settings, max_body_bytes=limit))  # type: ignore[operator]
    big = meta_bytes(message_payload("wamid.big", text="x" * (3 * 1024 * 1024)))
    assert len(big) > 3 * 1024 * 1024
    assert (await post_meta(http, server, big, sign_meta(big, META_SECRET)))[0] == 200
    too_big = meta_bytes(message_payload("wamid.huge", text="y" * (limit + 10)))
    status, _ = await post_meta(http, server, too_big, sign_meta(too_big, META_SECRET))
    assert status == 413
    assert await inbox_bodies(pool) == [big]


async def test_database_down_gives_503_and_recovers(
    http: ClientSession, gateway: TestServer, pool: asyncpg.Pool, pg_admin_dsn: str, db_dsn: str
) -> None:
    dbname = database_name(db_dsn)
    admin = await asyncpg.connect(pg_admin_dsn)
    await pool.close()
    try:
        await admin.execute(f'ALTER DATABASE "{dbname}" ALLOW_CONNECTIONS false')
        await admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1", dbname
        )
        bodies = [meta_bytes(message_payload(f"wamid.down{i}")) for i in range(5)]
        results = await asyncio.gather(
            *(post_meta(http, gateway, b, sign_meta(b, META_SECRET)) for b in bodies)
        )
        assert [s for s, _ in results] == [503] * 5
        await admin.execute(f'ALTER DATABASE "{dbname}" ALLOW_CONNECTIONS true')
        after = meta_bytes(message_payload("wamid.after"))
        assert (await post_meta(http, gateway, after, sign_meta(after, META_SECRET)))[0] == 200
        check = await asyncpg.connect(db_dsn)
        try:
            stored = [r["body"] for r in await check.fetch("SELECT body FROM webhook_inbox")]
        finally:
            await check.close()
        assert stored == [after]
    finally:
        await admin.execute(f'ALTER DATABASE "{dbname}" ALLOW_CONNECTIONS true')
        await admin.close()


async def test_commit_past_deadline_gives_503(
    http: ClientSession, start_gateway: object, settings: Settings, pool: asyncpg.Pool
) -> None:
    server = await start_gateway(replace(settings, ack_deadline_ms=300))  # type: ignore[operator]
    body = meta_bytes(message_payload("wamid.slow"))
    async with pool.acquire() as blocker, blocker.transaction():
        await blocker.execute("LOCK TABLE webhook_inbox IN ACCESS EXCLUSIVE MODE")
        status, _ = await post_meta(http, server, body, sign_meta(body, META_SECRET))
        assert status == 503
    # The late commit may still land; a redelivery is harmless, a lost 200 is not.


@pytest.mark.citus
async def test_concurrent_requests_share_commits(
    http: ClientSession, gateway: TestServer, pool: asyncpg.Pool
) -> None:
    bodies = [meta_bytes(message_payload(f"wamid.c{i}")) for i in range(200)]
    results = await asyncio.gather(*(post_meta(http, gateway, b, sign_meta(b, META_SECRET)) for b in bodies))
    assert [s for s, _ in results] == [200] * 200
    assert sorted(await inbox_bodies(pool)) == sorted(bodies)
    transactions = await pool.fetchval("SELECT count(DISTINCT xmin::text) FROM webhook_inbox")
    assert transactions < 200
    assert gateway.app[COMMITTER].batches_written == transactions


@pytest.mark.citus
async def test_tenashi_signed_event_is_stored_with_delivery_id(
    http: ClientSession, gateway: TestServer, pool: asyncpg.Pool
) -> None:
    body = b'{"id":"evt_5f0c8e2a91b34d7c6e1f2a90","type":"message.delivered"}'
    headers = {
        "X-Tenashi-Signature": sign_tenashi(body, TENASHI_SECRET),
        "X-Tenashi-Delivery": "evt_5f0c8e2a91b34d7c6e1f2a90",
    }
    async with http.post(gateway.make_url("/webhooks/tenashi"), data=body, headers=headers) as r:
        assert r.status == 200
    headers["X-Tenashi-Signature"] = sign_tenashi(body, "some-other-secret")
    async with http.post(gateway.make_url("/webhooks/tenashi"), data=body, headers=headers) as r:
        assert r.status == 401
    rows = await pool.fetch("SELECT source, body, delivery_id FROM webhook_inbox")
    assert [dict(r) for r in rows] == [
        {"source": "tenashi", "body": body, "delivery_id": "evt_5f0c8e2a91b34d7c6e1f2a90"}
    ]


async def test_health_ready_and_metrics(
    http: ClientSession, start_gateway: Any, settings: Settings, pool: asyncpg.Pool
) -> None:
    gateway: TestServer = await start_gateway(public_metrics(settings))
    async with http.get(gateway.make_url("/healthz")) as r:
        assert r.status == 200
    async with http.get(gateway.make_url("/readyz")) as r:
        assert r.status == 200
        assert (await r.json())["status"] == "ready"
    body = meta_bytes(message_payload(f"wamid.{uuid.uuid4().hex}"))
    assert (await post_meta(http, gateway, body, sign_meta(body, META_SECRET)))[0] == 200
    before = gauges_fresh()
    async with http.get(gateway.make_url("/metrics")) as r:
        text = await r.text()
    after = gauges_fresh()
    assert 'gateway_webhook_requests_total{outcome="stored",source="meta"}' in text
    assert "gateway_ack_latency_seconds_bucket" in text
    assert "gateway_commit_batch_size_count" in text
    # Database-wide gauges come only from the gauge leader (a process running maintenance jobs):
    # a gateway without workers never exports them (other tests in this process may have, and
    # they stay exported for max_age_s after their last refresh; that may end during the scrape).
    assert ("gateway_inbox_depth" in text) in {before, after}


def gauges_fresh() -> bool:
    at = metrics.DB_GAUGES.refreshed_at
    return at is not None and time.monotonic() - at <= metrics.DB_GAUGES.max_age_s


async def test_readyz_reports_missing_schema(
    http: ClientSession, gateway: TestServer, pool: asyncpg.Pool
) -> None:
    await pool.execute("DELETE FROM schema_migrations")
    # /readyz answers from a probe that runs once a second.
    for _ in range(100):
        async with http.get(gateway.make_url("/readyz")) as r:
            status, body = r.status, await r.json()
        if status == 503:
            break
        await asyncio.sleep(0.05)
    assert status == 503
    assert "schema" in body["reason"]
