"""The reply guard is the tenant's: one reply per inbound message whoever answers (API or
handler, whatever the bot name), only to messages received on one of the tenant's numbers."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import asyncpg
import pytest
from aiohttp import ClientSession
from aiohttp.test_utils import TestServer

from gateway import handlers, metrics
from gateway.core.events import InboundMessage
from gateway.core.settings import Settings
from gateway.inbound.consumer import Consumer
from gateway.testing.payloads import message_payload, meta_bytes
from tests.support.http import GLOBEX, post_message_json

CONSUMER = Settings()


def reply(wamid: str, *, number: str = "1111", bot: str | None = None, text: str = "hi") -> dict[str, Any]:
    body: dict[str, Any] = {
        "to": "4915112345678",
        "phone_number_id": number,
        "type": "text",
        "text": {"body": text},
        "in_reply_to": wamid,
    }
    if bot is not None:
        body["bot"] = bot
    return body


async def received(pool: asyncpg.Pool, wamid: str, number: str) -> None:
    """An inbound message on ``number``, staged as a webhook and processed by a consumer."""
    body = meta_bytes(message_payload(wamid, phone_number_id=number))
    await pool.execute("INSERT INTO webhook_inbox (source, body) VALUES ('meta', $1)", body)
    consumer = Consumer(pool, dataclasses.replace(CONSUMER, database_url=""))
    while await consumer.step():
        pass


def two_tenants(settings: Settings, **changes: Any) -> Settings:
    numbers = (("acme", "1111"), ("globex", "2222"))
    return dataclasses.replace(settings, tenant_numbers=numbers, **changes)


async def test_another_tenant_cannot_answer_or_silence_a_message_of_ours(
    http: ClientSession, start_gateway: Any, settings: Settings, pool: asyncpg.Pool
) -> None:
    gw = await start_gateway(two_tenants(settings))
    await received(pool, "wamid.A", "1111")
    # Globex names acme's message from its own number: no such message of globex's.
    status, _, problem = await post_message_json(http, gw, reply("wamid.A", number="2222"), "g1", GLOBEX)
    assert status == 404 and "wamid.A" in problem["detail"]
    # So acme's bot is not silenced.
    assert (await post_message_json(http, gw, reply("wamid.A"), "a1"))[0] == 202
    assert await pool.fetchval("SELECT array_agg(tenant) FROM reply_claims") == ["acme"]
    # Globex's key was not spent on the refusal.
    assert await pool.fetchval("SELECT count(*) FROM idempotency_keys WHERE tenant = 'globex'") == 0


# On Citus too; the others need the consumers to store the inbound message (the batch
# statement on Citus: not yet).
@pytest.mark.citus
async def test_a_reply_to_a_message_never_received_is_404(
    http: ClientSession, gateway: TestServer, pool: asyncpg.Pool
) -> None:
    status, _, problem = await post_message_json(http, gateway, reply("wamid.NEVER"), "k1")
    assert status == 404 and problem["title"] == "no such inbound message"
    assert await pool.fetchval("SELECT count(*) FROM outbox") == 0


async def test_one_reply_per_message_whatever_the_bot_name(
    http: ClientSession, start_gateway: Any, settings: Settings, pool: asyncpg.Pool
) -> None:
    # No number bindings: every tenant owns every number, and still one reply per message.
    gw = await start_gateway(settings)
    await received(pool, "wamid.B", "1111")
    assert (await post_message_json(http, gw, reply("wamid.B", bot="a"), "k-a"))[0] == 202
    for key, bot in (("k-b", "b"), ("k-echo", "echo"), ("k-default", None)):
        status, _, problem = await post_message_json(http, gw, reply("wamid.B", bot=bot), key)
        assert status == 409 and problem["first_key"] == "k-a", (bot, problem)
    status, _, problem = await post_message_json(http, gw, reply("wamid.B", bot="z"), "g1", GLOBEX)
    assert status == 409 and "first_key" not in problem
    assert await pool.fetchval("SELECT count(*) FROM outbox") == 1


async def test_several_bots_per_message_is_a_tenants_opt_in(
    http: ClientSession, start_gateway: Any, settings: Settings, pool: asyncpg.Pool
) -> None:
    gw = await start_gateway(dataclasses.replace(settings, reply_per_bot_tenants=("acme",)))
    await received(pool, "wamid.C", "1111")
    assert (await post_message_json(http, gw, reply("wamid.C", bot="orders"), "o1"))[0] == 202
    assert (await post_message_json(http, gw, reply("wamid.C", bot="survey"), "s1"))[0] == 202
    # Each bot still once; another tenant (not opted in, or opted in) not at all.
    assert (await post_message_json(http, gw, reply("wamid.C", bot="survey", text="2"), "s2"))[0] == 409
    assert (await post_message_json(http, gw, reply("wamid.C", bot="other"), "g1", GLOBEX))[0] == 409
    # A tenant that opted in cannot add its bots to a message another tenant answered.
    await received(pool, "wamid.D", "1111")
    assert (await post_message_json(http, gw, reply("wamid.D", bot="x"), "g2", GLOBEX))[0] == 202
    assert (await post_message_json(http, gw, reply("wamid.D", bot="orders"), "o2"))[0] == 409


def event(wamid: str) -> InboundMessage:
    return InboundMessage(f"msg:{wamid}", wamid, "1111", "4915112345678", "text", None, None, {})


def refused(via: str) -> float:
    value = metrics.REGISTRY.get_sample_value("gateway_replies_refused_total", {"via": via})
    return value or 0.0


async def test_handler_reply_and_the_api_follow_one_rule_and_a_refusal_is_logged_and_counted(
    http: ClientSession, gateway: TestServer, pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture
) -> None:
    await received(pool, "wamid.E", "1111")
    await received(pool, "wamid.F", "1111")
    # The API answered first: a handler's reply under any bot name is refused, with a trace.
    assert (await post_message_json(http, gateway, reply("wamid.E", bot="orders"), "k1"))[0] == 202
    before = refused("handler")
    with caplog.at_level(logging.WARNING, logger="gateway.handlers"):
        async with pool.acquire() as conn, conn.transaction():
            assert await handlers.reply(conn, event("wamid.E"), text="echo", bot="echo") is False
    assert refused("handler") == before + 1
    assert any("wamid.E" in r.getMessage() and "acme/orders" in r.getMessage() for r in caplog.records)
    # A handler answered first: the API's reply under another bot name is refused (and counted).
    async with pool.acquire() as conn, conn.transaction():
        assert await handlers.reply(conn, event("wamid.F"), text="echo", bot="echo") is True
    api_before = refused("api")
    status, _, problem = await post_message_json(http, gateway, reply("wamid.F", bot="orders"), "k2")
    assert status == 409 and "first_key" not in problem
    assert refused("api") == api_before + 1
    # SQL callers follow the same rule.
    assert await pool.fetchval("SELECT claim_reply('wamid.F', 'sql-bot')") is False
