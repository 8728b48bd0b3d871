"""An Idempotency-Key is bound to its body for as long as its outbox row exists (never a 2xx
that sends nothing), and a send the provider refused for good frees the key for a corrected
retry (a new send)."""

from __future__ import annotations

import dataclasses
from typing import Any

import asyncpg
import pytest
from aiohttp import ClientSession
from aiohttp.test_utils import TestServer

from gateway.core.messages import callback_data
from gateway.core.settings import Settings
from gateway.outbound.sender import Sender
from gateway.testing.fake_provider import FakeConfig, FakeProvider
from tests.support.http import post_message_json


def msg(text: str, to: str = "4915112345678") -> dict[str, Any]:
    return {"to": to, "phone_number_id": "1111", "type": "text", "text": {"body": text}}


@pytest.fixture
async def fake() -> Any:
    f = FakeProvider(FakeConfig(seed=3))
    await f.start()
    yield f
    await f.stop()


def with_fake(settings: Settings, fake: FakeProvider) -> Settings:
    return dataclasses.replace(
        settings,
        graph_url=fake.url + "/v21.0",
        graph_token="graph-token",
        tenashi_url=fake.url,
        tenashi_token="tenashi-token",
        pair_interval_s=0.0,
    )


async def send_all(pool: asyncpg.Pool, s: Settings) -> None:
    sender = Sender(pool, s)
    try:
        while await sender.step():
            pass
    finally:
        await sender.close()


async def expire_keys(pool: asyncpg.Pool, *, purge: bool = False) -> None:
    if purge:
        await pool.execute("DELETE FROM idempotency_keys")
    else:
        # now(), not clock_timestamp(): Citus refuses a volatile function in an UPDATE.
        await pool.execute("UPDATE idempotency_keys SET expires_at = now() - interval '1 s'")


@pytest.mark.parametrize("purge", [False, True], ids=["expired", "purged"])
async def test_an_expired_key_stays_bound_to_its_body_while_its_row_exists(
    http: ClientSession, gateway: TestServer, pool: asyncpg.Pool, purge: bool
) -> None:
    assert (await post_message_json(http, gateway, msg("Payment of 900 EUR received"), "pay-1"))[0] == 202
    await expire_keys(pool, purge=purge)
    # Another body under the expired key: refused, not a 2xx that sends nothing.
    status, _, problem = await post_message_json(http, gateway, msg("Your order shipped"), "pay-1")
    assert status == 422 and "different body" in problem["title"]
    assert await pool.fetchval("SELECT payload->'text'->>'body' FROM outbox") == "Payment of 900 EUR received"
    # The same body again is answered from its row (a replay: nothing new is sent).
    status, headers, body = await post_message_json(
        http, gateway, msg("Payment of 900 EUR received"), "pay-1"
    )
    assert (status, headers["Idempotent-Replayed"], body["state"]) == (202, "true", "pending")
    assert await pool.fetchval("SELECT count(*) FROM outbox") == 1


@pytest.mark.parametrize("expired", [False, True], ids=["within-ttl", "after-ttl"])
@pytest.mark.citus
async def test_a_permanent_rejection_frees_the_key_for_a_corrected_send(
    http: ClientSession,
    start_gateway: Any,
    settings: Settings,
    pool: asyncpg.Pool,
    fake: FakeProvider,
    expired: bool,
) -> None:
    s = with_fake(settings, fake)
    gw = await start_gateway(s)
    fake.add_fault("error", code=131026)  # message undeliverable: refused, nothing sent
    assert (await post_message_json(http, gw, msg("hello", to="4915100000001"), "k"))[0] == 202
    await send_all(pool, s)
    assert await pool.fetchval("SELECT state FROM outbox") == "failed"
    assert fake.received == []
    if expired:
        await expire_keys(pool)
    # The corrected body under the same key is a new send.
    status, headers, body = await post_message_json(http, gw, msg("hello again", to="4915100000002"), "k")
    assert (status, body["state"]) == (202, "pending") and "Idempotent-Replayed" not in headers
    await send_all(pool, s)
    assert [(r.to, r.message["text"]["body"]) for r in fake.received] == [("4915100000002", "hello again")]
    row = await pool.fetchrow("SELECT state, generation, callback_data, attempts FROM outbox")
    assert (row["state"], row["generation"], row["attempts"]) == ("accepted", 1, 1)
    # Its own callback data, which the provider saw: statuses find the new send.
    assert row["callback_data"] != callback_data("acme", "k")
    assert fake.received[0].callback_data == row["callback_data"]
    # Now it is bound again: the same body replays, another body is refused.
    _, headers, _ = await post_message_json(http, gw, msg("hello again", to="4915100000002"), "k")
    assert headers["Idempotent-Replayed"] == "true"
    assert (await post_message_json(http, gw, msg("third"), "k"))[0] == 422
