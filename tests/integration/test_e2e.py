"""The whole loop in one gateway: send API → sender → fake Graph API → signed status
webhooks (duplicated, reordered) → ingest → consumers → outbox."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
from aiohttp import ClientSession

from gateway.core.settings import Settings
from gateway.testing.fake_provider import FakeProvider
from tests.support.http import ACME, post_message
from tests.support.send import send_settings


async def test_send_is_resolved_by_its_own_status_webhooks(
    http: ClientSession, start_gateway: Any, settings: Settings, pool: asyncpg.Pool, fake: FakeProvider
) -> None:
    s = send_settings(
        settings, fake, run_sender=True, run_consumers=True, send_poll_ms=20, consumer_poll_ms=50
    )
    gw = await start_gateway(s)
    fake.config.webhook_url = str(gw.make_url("")).rstrip("/")
    fake.config.duplicates = 2
    fake.config.reorder = True
    body = {"to": "4915100000009", "phone_number_id": "1111", "type": "text", "text": {"body": "hi"}}
    for _ in range(3):  # the client retries its request; the customer must still get one message
        status, _, _ = await post_message(http, gw, body, "order-42")
        assert status in (202, 409)
    got: dict[str, Any] = {}
    for _ in range(200):
        async with http.get(gw.make_url("/v1/messages/order-42"), headers=ACME) as r:
            got = await r.json()
        if got.get("delivery_status") == "read":
            break
        await asyncio.sleep(0.05)
    await fake.drain_webhooks()
    assert got["state"] == "accepted"
    assert got["delivery_status"] == "read"
    assert len(fake.received) == 1 and got["wamid"] == fake.received[0].id
    # 3 statuses x 3 copies were delivered; each was acted on once.
    for _ in range(100):
        if await pool.fetchval("SELECT count(*) FROM inbox_row_states() WHERE state = 'pending'") == 0:
            break
        await asyncio.sleep(0.05)
    assert await pool.fetchval("SELECT count(*) FROM webhook_inbox") == 9
    keys = sorted(r["event_key"] for r in await pool.fetch("SELECT event_key FROM processed_webhook_events"))
    wamid = got["wamid"]
    assert keys == [f"status:{wamid}:delivered:", f"status:{wamid}:read:", f"status:{wamid}:sent:"]
    assert await pool.fetchval("SELECT count(*) FROM message_statuses") == 3
