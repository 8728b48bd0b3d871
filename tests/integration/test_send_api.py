"""The send API over real HTTP against a real PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import os
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
from tests.support.config import replace
from tests.support.http import ACME, GLOBEX, post_message, url
from tests.support.send import FakeClock, send_everything, send_settings

# Also on a Citus cluster (make test-citus).
pytestmark = pytest.mark.citus


def msg(to: str = "4915112345678", text: str = "hi", **extra: Any) -> dict[str, Any]:
    return {"to": to, "phone_number_id": "1111", "type": "text", "text": {"body": text}, **extra}


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
    got, headers, _body = await post_message(http, gateway, msg(), auth=auth)
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
        ("k", msg(to="abc"), 400, "to: must match"),
        # `$` must not match before a trailing newline (Python's re would let it through).
        ("k", msg(to="4915112345678\n"), 400, "to: must match"),
        ("k", {**msg(), "phone_number_id": "1111\n"}, 400, "phone_number_id: must match"),
        ("k", {**msg(), "phone_number_id": ""}, 400, "phone_number_id"),
        ("k", {**msg(), "type": "poll"}, 400, "type: one of text, image"),
        ("k", {**msg(), "type": "image"}, 400, "body: 'image' is a required property"),
        ("k", {**msg(), "text": {"body": ""}}, 400, "text.body: at least 1 character"),
        ("k", {**msg(), "text": {"body": "x" * 4097}}, 400, "text.body: at most 4096 characters"),
        ("k", msg(text="a\u0000b"), 400, "text.body"),
        ("k", msg(unknown_policy="later"), 400, "unknown_policy: one of resend, review"),
        ("k", msg(extra=1), 400, "unknown fields: extra"),
        ("k", msg(in_reply_to=""), 400, "in_reply_to"),
        ("k", msg(in_reply_to="wamid.A", bot="two words"), 400, "bot: must match"),
        (
            "k",
            {"to": "4915112345678", "phone_number_id": "1", "type": "template", "template": {}},
            400,
            "template: 'name' is a required property",
        ),
        (
            "k",
            {
                "to": "4915112345678",
                "phone_number_id": "1",
                "type": "template",
                "template": {
                    "name": "hi",
                    "language": {"code": "en"},
                    "components": [{"type": "body", "parameters": [{"type": "text", "text": "a\u0000"}]}],
                },
            },
            400,
            "parameters.0.text: must match ^[^\\u0000]*$",
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
    got, headers, raw = await post_message(http, gateway, body, key=key)
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
    s1, h1, b1 = await post_message(http, gateway, msg(), key="order-1")
    assert s1 == 202
    assert orjson.loads(b1) == {"key": "order-1", "state": "pending", "provider": "meta"}
    assert h1["Location"] == "/v1/messages/order-1"
    assert "Idempotent-Replayed" not in h1
    # Same body with other key order and whitespace: same fingerprint.
    reordered = json.dumps(dict(reversed(list(msg().items()))), indent=2).encode()
    s2, h2, b2 = await post_message(http, gateway, reordered, key="order-1")
    assert (s2, b2) == (s1, b1)
    assert h2["Idempotent-Replayed"] == "true"
    assert h2["Location"] == h1["Location"] and h2["Content-Type"] == h1["Content-Type"]
    assert await pool.fetchval("SELECT count(*) FROM outbox") == 1


async def test_other_body_same_key_is_422(
    http: ClientSession, gateway: TestServer, pool: asyncpg.Pool
) -> None:
    assert (await post_message(http, gateway, msg(text="a"), key="k"))[0] == 202
    status, headers, _raw = await post_message(http, gateway, msg(text="b"), key="k")
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
    status, headers, _ = await post_message(http, gateway, body, key="k")
    assert status == 409
    assert int(headers["Retry-After"]) >= 1
    # A claim left behind by a crashed request is taken over after its lease.
    await pool.execute("UPDATE idempotency_keys SET locked_at = now() - interval '1 minute'")
    assert (await post_message(http, gateway, body, key="k"))[0] == 202


async def test_keys_are_tenant_scoped(http: ClientSession, gateway: TestServer, pool: asyncpg.Pool) -> None:
    assert (await post_message(http, gateway, msg(text="a"), key="same"))[0] == 202
    assert (await post_message(http, gateway, msg(text="b"), key="same", auth=GLOBEX))[0] == 202
    assert await pool.fetchval("SELECT count(*) FROM outbox") == 2
    async with http.get(url(gateway, "/v1/messages/same"), headers=GLOBEX) as r:
        assert (await r.json())["state"] == "pending"
    async with http.get(url(gateway, "/v1/messages/only-acme"), headers=GLOBEX) as r:
        assert r.status == 404
        assert r.content_type == "application/problem+json"


@pytest.mark.skipif(
    bool(os.environ.get("GATEWAY_TEST_CITUS")),
    reason="the reconciler's pass calls SQL functions over distributed tables (inbox_unprocessed), "
    "which Citus cannot plan",
)
async def test_expired_key_is_purged_and_never_resends(
    http: ClientSession, gateway: TestServer, pool: asyncpg.Pool, settings: Settings
) -> None:
    assert (await post_message(http, gateway, msg(), key="old"))[0] == 202
    await pool.execute("UPDATE idempotency_keys SET expires_at = now() - interval '1 second'")
    counts = await Reconciler(pool, settings).run_once()
    assert counts["purged_keys"] == 1
    # The outbox still holds the business event: the key stays bound to its body, no second row
    # (and no 2xx for a body that would never be sent).
    status, _, _raw = await post_message(http, gateway, msg(text="new body"), key="old")
    assert status == 422
    assert await pool.fetchval("SELECT count(*) FROM outbox") == 1


async def test_get_message(http: ClientSession, gateway: TestServer) -> None:
    key = "order/42:x"  # percent-encoded in the path
    assert (await post_message(http, gateway, msg(), key=key))[0] == 202
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

    def documented_as(path: str) -> str:
        return path.replace("{key:.+}", "{key}").replace("{version:(?!(?:v1|webhooks)/)[^/]+}", "{version}")

    routes = {
        (documented_as(res.canonical), route.method.lower())
        for res in gateway.app.router.resources()  # type: ignore[union-attr]
        for route in res
        if res.canonical.startswith(("/v1/", "/{version")) and route.method != "HEAD"
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
    results = await asyncio.gather(*(post_message(http, gw, msg(), key="burst") for _ in range(50)))
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
    status, headers, raw = await post_message(http, gw, msg(), key="burst")
    assert (status, raw, headers["Idempotent-Replayed"]) == (202, firsts[0][2], "true")
    async with http.get(url(gw, "/v1/messages/burst"), headers=ACME) as r:
        got = await r.json()
    assert got["state"] == "accepted" and got["wamid"] == fake.received[0].id


async def test_get_rejects_keys_postgres_cannot_hold(http: ClientSession, gateway: TestServer) -> None:
    for path in ("/v1/messages/a%00b", "/v1/messages/a%20b", "/v1/messages/" + "x" * 256):
        async with http.get(url(gateway, path), headers=ACME) as r:
            assert r.status == 400, path
            assert r.content_type == "application/problem+json"
            assert (await r.json())["title"] in ("Idempotency-Key invalid", "Idempotency-Key too long")


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [("GET", "/nowhere", 404), ("DELETE", "/v1/messages", 405), ("PUT", "/v1/openapi.json", 405)],
)
async def test_routing_errors_are_problems(
    http: ClientSession, gateway: TestServer, method: str, path: str, status: int
) -> None:
    async with http.request(method, url(gateway, path), headers=ACME) as r:
        assert r.status == status
        assert r.content_type == "application/problem+json"
        body = await r.json()
    assert body["status"] == status and body["title"]
    if status == 405:
        assert "GET" in r.headers["Allow"] or "POST" in r.headers["Allow"]


def reply(wamid: str = "wamid.IN1", text: str = "thanks", **extra: Any) -> dict[str, Any]:
    return msg(text=text, in_reply_to=wamid, **extra)


async def received(pool: asyncpg.Pool, *wamids: str) -> None:
    """Inbound messages on number 1111 (a reply must name a message that was received)."""
    for wamid in wamids:
        await pool.execute(
            "INSERT INTO inbound_messages (wamid, phone_number_id, sender, message, subject)"
            " VALUES ($1, '1111', '4915112345678', '{}', $1)",
            wamid,
        )


async def test_twenty_concurrent_replies_to_one_message_one_accepted(
    http: ClientSession, start_gateway: Any, settings: Settings, pool: asyncpg.Pool
) -> None:
    gw = await start_gateway(replace(settings, db_pool_max=20))
    await received(pool, "wamid.IN1")
    results = await asyncio.gather(
        *(post_message(http, gw, reply(text=f"answer {i}"), key=f"reply-{i}") for i in range(20))
    )
    statuses = sorted(r[0] for r in results)
    assert statuses == [202] + [409] * 19
    winner = next(f"reply-{i}" for i, r in enumerate(results) if r[0] == 202)
    for status, headers, raw in results:
        if status == 409:
            assert headers["Content-Type"].startswith("application/problem+json")
            problem = orjson.loads(raw)
            assert problem["first_key"] == winner
            assert winner in problem["detail"]
            assert problem["first_location"] == f"/v1/messages/{winner}"
    assert await pool.fetchval("SELECT count(*) FROM outbox") == 1
    assert await pool.fetchval("SELECT idem_key FROM outbox") == winner
    # The refused requests burnt no key: only the winner's is stored.
    assert await pool.fetchval("SELECT array_agg(key) FROM idempotency_keys") == [winner]
    assert await pool.fetchval("SELECT count(*) FROM reply_claims") == 1


async def test_reply_is_threaded_once_per_bot_for_a_tenant_that_opted_in(
    http: ClientSession, start_gateway: Any, settings: Settings, pool: asyncpg.Pool, fake: FakeProvider
) -> None:
    # No pair pacing: the three replies to the one customer go one after the other at once.
    s = send_settings(settings, fake, reply_per_bot_tenants=("acme",), pair_interval_s=0.0)
    gw = await start_gateway(s)
    await received(pool, "wamid.IN1", "wamid.IN2")
    assert (await post_message(http, gw, reply(), key="r1"))[0] == 202
    # The same request again is a replay, not a second reply.
    status, headers, _ = await post_message(http, gw, reply(), key="r1")
    assert (status, headers["Idempotent-Replayed"]) == (202, "true")
    # The same bot ("default") with another answer: refused, naming the first key.
    status, _, raw = await post_message(http, gw, reply(text="again"), key="r2")
    assert status == 409 and orjson.loads(raw)["first_key"] == "r1"
    # Another bot may answer the same message once; another message is free for the first bot.
    assert (await post_message(http, gw, reply(bot="survey"), key="r3"))[0] == 202
    assert (await post_message(http, gw, reply(bot="survey", text="2"), key="r4"))[0] == 409
    assert (await post_message(http, gw, reply("wamid.IN2"), key="r5"))[0] == 202
    # Another tenant's bot learns that it was answered, not the other key.
    status, _, raw = await post_message(http, gw, reply(text="globex"), key="g1", auth=GLOBEX)
    assert status == 409 and "first_key" not in orjson.loads(raw) and "r1" not in raw.decode()
    clock = FakeClock()
    sender = Sender(pool, s, clock=clock)
    try:
        await send_everything(sender, clock)
    finally:
        await sender.close()
    threaded = {r.message["context"]["message_id"] for r in fake.received}
    assert len(fake.received) == 3 and threaded == {"wamid.IN1", "wamid.IN2"}
    async with http.get(url(gw, "/v1/messages/r1"), headers=ACME) as r:
        assert (await r.json())["in_reply_to"] == "wamid.IN1"
    async with http.get(url(gw, "/v1/messages/burst-none"), headers=ACME) as r:
        assert r.status == 404


async def test_reply_claimed_in_sql_blocks_the_send_api(
    http: ClientSession, gateway: TestServer, pool: asyncpg.Pool
) -> None:
    # A handler took the right to reply with claim_reply(): the API refuses without a key to name.
    await received(pool, "wamid.H")
    assert await pool.fetchval("SELECT claim_reply('wamid.H', 'default')") is True
    status, _, raw = await post_message(http, gateway, reply("wamid.H"), key="k")
    assert status == 409 and "first_key" not in orjson.loads(raw)
    assert await pool.fetchval("SELECT count(*) FROM outbox") == 0
