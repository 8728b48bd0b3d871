"""The send API over real HTTP against a real PostgreSQL."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import asyncpg
import orjson
import pytest
from aiohttp import ClientSession
from aiohttp.test_utils import TestServer

from gateway.core.messages import fingerprint
from gateway.core.settings import Settings
from gateway.maintenance.reconciler import Reconciler
from gateway.outbound import send_api
from gateway.outbound.sender import Sender
from gateway.store import idempotency
from gateway.testing.fake_provider import FakeProvider
from tests.sendkit import fake_provider, send_settings  # noqa: F401 - the `fake` fixture

ACME = {"Authorization": "Bearer acme-api-key-0123456789"}
GLOBEX = {"Authorization": "Bearer globex-api-key-0123456789"}


def msg(to: str = "4915112345678", text: str = "hi", **extra: Any) -> dict[str, Any]:
    return {"to": to, "phone_number_id": "1111", "type": "text", "text": {"body": text}, **extra}


def url(gw: TestServer, path: str) -> str:
    return str(gw.make_url(path))


async def post(
    http: ClientSession, gw: TestServer, body: Any, key: str | None = "k1", auth: dict[str, str] = ACME
) -> tuple[int, dict[str, str], bytes]:
    headers = dict(auth)
    if key is not None:
        headers["Idempotency-Key"] = key
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    async with http.post(url(gw, "/v1/messages"), data=data, headers=headers) as r:
        return r.status, dict(r.headers), await r.read()


@pytest.mark.parametrize(
    ("auth", "status"),
    [
        ({}, 401),
        ({"Authorization": "Bearer wrong-key-0123456789"}, 401),
        ({"Authorization": "Basic acme-api-key-0123456789"}, 401),
        ({"Authorization": "Bearer "}, 401),
        (ACME, 202),
    ],
)
async def test_auth(http: ClientSession, gateway: TestServer, auth: dict[str, str], status: int) -> None:
    got, headers, _body = await post(http, gateway, msg(), auth=auth)
    assert got == status
    if status == 401:
        assert headers["Content-Type"].startswith("application/problem+json")
        assert "WWW-Authenticate" in headers


@pytest.mark.parametrize(
    ("key", "body", "status", "needle"),
    [
        (None, msg(), 400, "Idempotency-Key header required"),
        ("x" * 256, msg(), 400, "too long"),
        ("has space", msg(), 400, "invalid"),
        ("k", b"{not json", 400, "not JSON"),
        ("k", [1, 2], 400, "JSON object"),
        ("k", msg(to="abc"), 400, "to:"),
        ("k", {**msg(), "phone_number_id": ""}, 400, "phone_number_id"),
        ("k", {**msg(), "type": "image"}, 400, "type: text or template"),
        ("k", {**msg(), "text": {"body": ""}}, 400, "text:"),
        ("k", {**msg(), "text": {"body": "x" * 4097}}, 400, "4096"),
        ("k", msg(unknown_policy="later"), 400, "unknown_policy"),
        ("k", msg(extra=1), 400, "unknown fields: extra"),
        (
            "k",
            {"to": "4915112345678", "phone_number_id": "1", "type": "template", "template": {}},
            400,
            "template",
        ),
        ("k", b"x" * (70 * 1024), 413, "too large"),
    ],
)
async def test_bad_requests(
    http: ClientSession,
    gateway: TestServer,
    pool: asyncpg.Pool,
    key: str | None,
    body: Any,
    status: int,
    needle: str,
) -> None:
    got, headers, raw = await post(http, gateway, body, key=key)
    assert got == status
    assert headers["Content-Type"].startswith("application/problem+json")
    problem = orjson.loads(raw)
    assert problem["status"] == status
    assert needle in problem["title"] + problem.get("detail", "")
    assert await pool.fetchval("SELECT count(*) FROM outbox") == 0
    assert await pool.fetchval("SELECT count(*) FROM idempotency_keys") == 0  # a bad request burns no key


async def test_first_request_then_exact_replay(
    http: ClientSession, gateway: TestServer, pool: asyncpg.Pool
) -> None:
    s1, h1, b1 = await post(http, gateway, msg(), key="order-1")
    assert s1 == 202
    assert orjson.loads(b1) == {"key": "order-1", "state": "pending", "provider": "meta"}
    assert h1["Location"] == "/v1/messages/order-1"
    assert "Idempotent-Replayed" not in h1
    # Same body with other key order and whitespace: same fingerprint.
    reordered = json.dumps(dict(reversed(list(msg().items()))), indent=2).encode()
    s2, h2, b2 = await post(http, gateway, reordered, key="order-1")
    assert (s2, b2) == (s1, b1)
    assert h2["Idempotent-Replayed"] == "true"
    assert h2["Location"] == h1["Location"] and h2["Content-Type"] == h1["Content-Type"]
    assert await pool.fetchval("SELECT count(*) FROM outbox") == 1


async def test_other_body_same_key_is_422(
    http: ClientSession, gateway: TestServer, pool: asyncpg.Pool
) -> None:
    assert (await post(http, gateway, msg(text="a"), key="k"))[0] == 202
    status, headers, _raw = await post(http, gateway, msg(text="b"), key="k")
    assert status == 422
    assert headers["Content-Type"].startswith("application/problem+json")
    assert await pool.fetchval("SELECT count(*) FROM outbox") == 1


async def test_in_progress_is_409_with_retry_after(
    http: ClientSession, gateway: TestServer, pool: asyncpg.Pool
) -> None:
    body = msg()
    # A first request that has claimed the key and not finished yet.
    claimed = await idempotency.claim(
        pool, tenant="acme", key="k", fingerprint=fingerprint(body), ttl_h=72, lease_s=30.0
    )
    assert claimed
    status, headers, _ = await post(http, gateway, body, key="k")
    assert status == 409
    assert int(headers["Retry-After"]) >= 1
    # A claim left behind by a crashed request is taken over after its lease.
    await pool.execute("UPDATE idempotency_keys SET locked_at = now() - interval '1 minute'")
    assert (await post(http, gateway, body, key="k"))[0] == 202


async def test_keys_are_tenant_scoped(http: ClientSession, gateway: TestServer, pool: asyncpg.Pool) -> None:
    assert (await post(http, gateway, msg(text="a"), key="same"))[0] == 202
    assert (await post(http, gateway, msg(text="b"), key="same", auth=GLOBEX))[0] == 202
    assert await pool.fetchval("SELECT count(*) FROM outbox") == 2
    async with http.get(url(gateway, "/v1/messages/same"), headers=GLOBEX) as r:
        assert (await r.json())["state"] == "pending"
    async with http.get(url(gateway, "/v1/messages/only-acme"), headers=GLOBEX) as r:
        assert r.status == 404
        assert r.content_type == "application/problem+json"


async def test_expired_key_is_purged_and_never_resends(
    http: ClientSession, gateway: TestServer, pool: asyncpg.Pool, settings: Settings
) -> None:
    assert (await post(http, gateway, msg(), key="old"))[0] == 202
    await pool.execute("UPDATE idempotency_keys SET expires_at = now() - interval '1 second'")
    counts = await Reconciler(pool, settings).run_once()
    assert counts["purged_keys"] == 1
    # The key is free again, but the outbox still holds the business event: no second row.
    status, _, _raw = await post(http, gateway, msg(text="new body"), key="old")
    assert status == 202
    assert await pool.fetchval("SELECT count(*) FROM outbox") == 1


async def test_get_message(http: ClientSession, gateway: TestServer) -> None:
    key = "order/42:x"  # percent-encoded in the path
    assert (await post(http, gateway, msg(), key=key))[0] == 202
    async with http.get(url(gateway, "/v1/messages/order%2F42%3Ax"), headers=ACME) as r:
        assert r.status == 200
        got = await r.json()
    assert got["key"] == key and got["state"] == "pending" and got["wamid"] is None
    async with http.get(url(gateway, "/v1/messages/order%2F42%3Ax")) as r:
        assert r.status == 401


async def test_openapi_served_matches_file_and_covers_routes(
    http: ClientSession, gateway: TestServer
) -> None:
    async with http.get(url(gateway, "/v1/openapi.json")) as r:
        assert r.status == 200
        served = await r.read()
    assert served == send_api.OPENAPI_PATH.read_bytes()
    doc = json.loads(served)
    assert doc["openapi"].startswith("3.")
    routes = {
        (res.canonical.replace("{key:.+}", "{key}"), route.method.lower())
        for res in gateway.app.router.resources()  # type: ignore[union-attr]
        for route in res
        if res.canonical.startswith("/v1/") and route.method != "HEAD"
    }
    documented = {(path, method) for path, ops in doc["paths"].items() for method in ops}
    assert routes == documented
    codes = set(doc["paths"]["/v1/messages"]["post"]["responses"])
    assert {"202", "400", "401", "409", "422"} <= codes


async def test_fifty_concurrent_posts_one_row_one_send(
    http: ClientSession, start_gateway: Any, settings: Settings, pool: asyncpg.Pool, fake: FakeProvider
) -> None:
    s = send_settings(settings, fake, db_pool_max=20)
    gw = await start_gateway(s)
    results = await asyncio.gather(*(post(http, gw, msg(), key="burst") for _ in range(50)))
    statuses = [r[0] for r in results]
    assert set(statuses) <= {202, 409}
    firsts = [r for r in results if r[0] == 202]
    assert firsts and all(r[2] == firsts[0][2] for r in firsts)  # every 202 is the same response
    assert await pool.fetchval("SELECT count(*) FROM outbox") == 1
    assert await pool.fetchval("SELECT count(*) FROM idempotency_keys") == 1
    sender = Sender(pool, s)
    try:
        await sender.step()
        await sender.step()
    finally:
        await sender.close()
    assert len(fake.received) == 1
    # After the send, the replay still returns the first response; GET shows the new state.
    status, headers, raw = await post(http, gw, msg(), key="burst")
    assert (status, raw, headers["Idempotent-Replayed"]) == (202, firsts[0][2], "true")
    async with http.get(url(gw, "/v1/messages/burst"), headers=ACME) as r:
        got = await r.json()
    assert got["state"] == "accepted" and got["wamid"] == fake.received[0].id
