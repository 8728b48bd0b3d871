"""Every Cloud API message type, to phone numbers and BSUIDs, through the send API, the sender
and the fake Graph API; the caller's biz_opaque_callback_data back on the statuses; cancelling
and read receipts."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import pytest
from aiohttp import ClientSession

from gateway.core.events import Status
from gateway.core.settings import Settings
from gateway.handlers import Registry
from gateway.inbound.consumer import Consumer
from gateway.outbound.sender import Sender
from gateway.testing.fake_hub import Customer
from gateway.testing.fake_provider import FakeProvider
from gateway.testing.fake_receiver import FakeReceiver
from gateway.testing.messages import EXAMPLES
from gateway.testing.payloads import contact_obj, message_obj, meta_payload, meta_value, to_bytes
from tests.support.consume import stage
from tests.support.forward import add, fast, forwarding, until
from tests.support.http import ACME, GLOBEX, post_message_json
from tests.support.send import FakeClock, send_everything, send_settings

BSUID = "US.13491208655302741918"
PHONE = "4915112345678"
BOUND = (("acme", "1111"), ("globex", "2222"))


async def send_all(pool: asyncpg.Pool, s: Settings) -> None:
    clock = FakeClock()
    sender = Sender(pool, s, clock=clock)
    try:
        await send_everything(sender, clock)
    finally:
        await sender.close()


async def eventually(check: Callable[[], Awaitable[bool]], what: str) -> None:
    await until(check, timeout_s=20, what=what)


@pytest.mark.parametrize("addressed", ["to", "recipient"])
async def test_every_message_type_reaches_the_provider_as_sent(
    addressed: str,
    http: ClientSession,
    start_gateway: Any,
    settings: Settings,
    pool: asyncpg.Pool,
    fake: FakeProvider,
) -> None:
    s = send_settings(settings, fake, pair_interval_s=0.0)
    gw = await start_gateway(s)
    base = str(gw.make_url("")).rstrip("/")
    address = PHONE if addressed == "to" else BSUID
    for name, example in EXAMPLES.items():
        body = {addressed: address, "phone_number_id": "1111", **example}
        status, _, answer = await post_message_json(http, base, body, f"{addressed}-{name}")
        assert status == 202, (name, answer)
    await send_all(pool, s)
    assert len(fake.received) == len(EXAMPLES)
    got = {r.callback_data: r for r in fake.received}
    for name, example in EXAMPLES.items():
        r = got[f"acme:{addressed}-{name}"]
        assert r.message == {**example, "biz_opaque_callback_data": f"acme:{addressed}-{name}"}, name
        assert (r.to, r.addressed_by) == (address, addressed)


async def test_neither_to_nor_recipient_an_unknown_type_or_a_refused_body_enqueue_nothing(
    http: ClientSession, start_gateway: Any, settings: Settings, pool: asyncpg.Pool
) -> None:
    gw = await start_gateway(settings)
    base = str(gw.make_url("")).rstrip("/")
    cases = [
        (
            {"phone_number_id": "1111", **EXAMPLES["text"]},
            "to: give to (a phone number) or recipient (a BSUID)",
        ),
        (
            {"to": "x", "recipient": "y", "phone_number_id": "1111", **EXAMPLES["text"]},
            "recipient: must match",
        ),
        ({"to": PHONE, "phone_number_id": "1111", "type": "poll", "poll": {}}, "type: one of text, image"),
        (
            {
                "to": PHONE,
                "phone_number_id": "1111",
                "type": "image",
                "image": {"id": "1", "link": "https://e.x/a"},
            },
            "image: give id",
        ),
    ]
    for i, (body, error) in enumerate(cases):
        status, _, answer = await post_message_json(http, base, body, f"bad-{i}")
        assert status == 400 and any(e.startswith(error) for e in answer["errors"]), answer
    assert await pool.fetchval("SELECT count(*) FROM outbox") == 0
    assert await pool.fetchval("SELECT count(*) FROM idempotency_keys") == 0


async def test_a_media_id_of_another_tenants_number_is_refused(
    http: ClientSession, start_gateway: Any, settings: Settings, pool: asyncpg.Pool
) -> None:
    gw = await start_gateway(dataclasses.replace(settings, tenant_numbers=BOUND))
    base = str(gw.make_url("")).rstrip("/")
    insert = "INSERT INTO media (media_id, phone_number_id, origin, tenant) VALUES ($1, $2, 'upload', $3)"
    await pool.execute(insert, "555", "2222", "globex")
    image = {"to": PHONE, "phone_number_id": "1111", "type": "image", "image": {"id": "555"}}
    status, _, answer = await post_message_json(http, base, image, "steal")
    assert status == 400 and answer["errors"] == ["image: media id '555' is not of your numbers"]
    # An id the gateway never saw is refused too where tenants are bound to numbers.
    status, _, answer = await post_message_json(http, base, {**image, "image": {"id": "404404"}}, "unknown")
    assert status == 400
    status, _, _ = await post_message_json(
        http, base, {**image, "phone_number_id": "2222"}, "own", auth=GLOBEX
    )
    assert status == 202
    assert await pool.fetchval("SELECT count(*) FROM outbox") == 1


async def test_the_callers_callback_data_comes_back_on_statuses(
    http: ClientSession,
    start_gateway: Any,
    settings: Settings,
    pool: asyncpg.Pool,
    fake: FakeProvider,
    receiver: FakeReceiver,
) -> None:
    s = fast(send_settings(settings, fake))
    gw = await start_gateway(s)
    base = str(gw.make_url("")).rstrip("/")
    fake.config.webhook_url = base
    await add(pool, "orders", receiver.url, ("status",))
    body = {
        "to": PHONE,
        "phone_number_id": "1111",
        **EXAMPLES["text"],
        "biz_opaque_callback_data": "order-42|v2",
    }
    status, _, _ = await post_message_json(http, base, body, "cb-1")
    assert status == 202
    await send_all(pool, s)
    (sent,) = fake.received
    assert sent.callback_data == "acme:cb-1"  # the gateway correlates by its own key
    await fake.drain_webhooks()

    seen: list[Status] = []
    registry = Registry()

    @registry.status()
    async def on_status(event: Status, conn: Any) -> None:
        seen.append(event)

    consumer = Consumer(pool, s, handlers=registry)
    while await consumer.step():
        pass
    assert sorted(e.status for e in seen) == ["delivered", "read", "sent"]
    assert {e.biz_opaque_callback_data for e in seen} == {"order-42|v2"}
    assert {e.callback_data for e in seen} == {"acme:cb-1"}
    stored = await pool.fetch("SELECT DISTINCT biz_opaque_callback_data FROM message_statuses")
    assert [r[0] for r in stored] == ["order-42|v2"]

    async with forwarding(pool, s):
        await eventually(lambda: _got(receiver, 3), "three forwarded statuses")
    assert {d["data"]["biz_opaque_callback_data"] for d in receiver.state.processed.values()} == {
        "order-42|v2"
    }
    async with http.get(f"{base}/v1/messages/cb-1", headers=ACME) as r:
        got = await r.json()
    assert got["biz_opaque_callback_data"] == "order-42|v2" and got["delivery_status"] == "read"


async def _got(receiver: FakeReceiver, n: int) -> bool:
    return len(receiver.state.processed) >= n


async def test_a_reply_to_a_username_user_goes_to_their_bsuid(
    http: ClientSession,
    start_gateway: Any,
    settings: Settings,
    pool: asyncpg.Pool,
    fake: FakeProvider,
) -> None:
    s = send_settings(settings, fake)
    gw = await start_gateway(s)
    base = str(gw.make_url("")).rstrip("/")
    fake.add_customer(Customer(BSUID, username="ana.b"))
    msg = message_obj("wamid.U1", "hi", sender=None, user_id=BSUID)
    value = meta_value(messages=[msg], contacts=[contact_obj(None, BSUID, username="ana.b")])
    await stage(pool, to_bytes(meta_payload(("messages", value))))
    await Consumer(pool, s).step()
    reply = {"recipient": BSUID, "phone_number_id": "1111", "in_reply_to": "wamid.U1", **EXAMPLES["text"]}
    # Another customer cannot be the recipient of a reply to this message.
    status, _, answer = await post_message_json(http, base, {**reply, "recipient": "US.999"}, "r0")
    assert status == 400 and answer["errors"] == [
        "recipient: not the customer who wrote the message in_reply_to names"
    ]
    status, _, _ = await post_message_json(http, base, reply, "r1")
    assert status == 202
    await send_all(pool, s)
    (got,) = fake.received
    assert (got.to, got.addressed_by) == (BSUID, "recipient")
    assert got.message["context"] == {"message_id": "wamid.U1"}


@pytest.mark.citus
async def test_cancel_a_pending_message_but_not_a_sent_one(
    http: ClientSession, start_gateway: Any, settings: Settings, pool: asyncpg.Pool, fake: FakeProvider
) -> None:
    s = send_settings(settings, fake)
    gw = await start_gateway(s)
    base = str(gw.make_url("")).rstrip("/")
    body = {"to": PHONE, "phone_number_id": "1111", **EXAMPLES["text"]}
    assert (await post_message_json(http, base, body, "c1"))[0] == 202
    assert (await post_message_json(http, base, {**body, "to": "4915100000002"}, "c2"))[0] == 202
    async with http.delete(f"{base}/v1/messages/c1", headers=ACME) as r:
        assert r.status == 200 and await r.json() == {"key": "c1", "state": "cancelled"}
    async with http.delete(f"{base}/v1/messages/c1", headers=ACME) as r:
        assert r.status == 200  # again: still cancelled
    async with http.delete(f"{base}/v1/messages/c1", headers=GLOBEX) as r:
        assert r.status == 404  # another tenant's key
    await send_all(pool, s)
    assert [r.callback_data for r in fake.received] == ["acme:c2"]
    async with http.delete(f"{base}/v1/messages/c2", headers=ACME) as r:
        assert r.status == 409
        problem = await r.json()
    assert problem["state"] == "accepted"
    async with http.get(f"{base}/v1/messages/c1", headers=ACME) as r:
        assert (await r.json())["state"] == "cancelled"


async def test_mark_read_with_typing_indicator_from_the_number_the_message_came_to(
    http: ClientSession, start_gateway: Any, settings: Settings, pool: asyncpg.Pool, fake: FakeProvider
) -> None:
    s = dataclasses.replace(send_settings(settings, fake), tenant_numbers=BOUND)
    gw = await start_gateway(s)
    base = str(gw.make_url("")).rstrip("/")
    await stage(pool, to_bytes(meta_payload(("messages", meta_value(messages=[message_obj("wamid.R1")])))))
    await Consumer(pool, s).step()
    read = {"message_id": "wamid.R1", "typing_indicator": {"type": "text"}}
    async with http.post(f"{base}/v1/messages/read", json=read, headers=GLOBEX) as r:
        assert r.status == 404  # the message came to acme's number
    async with http.post(f"{base}/v1/messages/read", json={"message_id": "wamid.NONE"}, headers=ACME) as r:
        assert r.status == 404
    async with http.post(
        f"{base}/v1/messages/read", json={**read, "typing_indicator": {}}, headers=ACME
    ) as r:
        assert r.status == 400 and (await r.json())["errors"] == [
            "typing_indicator: 'type' is a required property"
        ]
    async with http.post(f"{base}/v1/messages/read", json=read, headers=ACME) as r:
        assert r.status == 200 and await r.json() == {"success": True}
    assert [(x.phone_number_id, x.message_id, x.typing) for x in fake.read_receipts] == [
        ("1111", "wamid.R1", True)
    ]
    assert fake.received == []  # a read receipt is not a message


async def test_mark_read_maps_graph_failures(
    http: ClientSession, start_gateway: Any, settings: Settings, pool: asyncpg.Pool, fake: FakeProvider
) -> None:
    s = send_settings(settings, fake)
    fake.config.number_tokens = {"1111": "the-right-token"}
    gw = await start_gateway(s)
    base = str(gw.make_url("")).rstrip("/")
    await stage(pool, to_bytes(meta_payload(("messages", meta_value(messages=[message_obj("wamid.R2")])))))
    await Consumer(pool, s).step()
    async with http.post(f"{base}/v1/messages/read", json={"message_id": "wamid.R2"}, headers=ACME) as r:
        assert r.status == 502 and (await r.json())["code"] == 190
    await asyncio.sleep(0)


async def test_tenashi_sends_take_a_phone_number(
    http: ClientSession, start_gateway: Any, settings: Settings, pool: asyncpg.Pool
) -> None:
    gw = await start_gateway(dataclasses.replace(settings, tenant_providers=(("acme", "tenashi"),)))
    base = str(gw.make_url("")).rstrip("/")
    status, _, answer = await post_message_json(
        http, base, {"recipient": BSUID, "phone_number_id": "1111", **EXAMPLES["text"]}, "t1"
    )
    assert status == 400 and answer["errors"] == ["recipient: Tenashi sends go to a phone number (to)"]
    assert await pool.fetchval("SELECT count(*) FROM outbox") == 0
