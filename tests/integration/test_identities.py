"""Customers named by BSUID: a username user without a phone number is seen by handlers and
destinations, answered by BSUID, and paced as one person with their phone number."""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest

from gateway.core.events import InboundMessage
from gateway.core.settings import Settings
from gateway.handlers import Registry, reply
from gateway.inbound.consumer import Consumer
from gateway.outbound.sender import Sender
from gateway.testing.fake_hub import Customer
from gateway.testing.fake_provider import FakeProvider
from gateway.testing.fake_receiver import FakeReceiver
from gateway.testing.payloads import contact_obj, message_obj, meta_payload, meta_value, to_bytes
from tests.support.consume import drain, stage
from tests.support.forward import add, fast, forwarding, until
from tests.support.send import FakeClock, enqueue, row, send_settings

PHONE = "4915112345678"
BSUID = "US.13491208655302741918"


def inbound(wamid: str, *, sender: str | None, user_id: str | None, contact: dict[str, Any]) -> bytes:
    msg = message_obj(wamid, "hi", sender=sender, user_id=user_id)
    return to_bytes(meta_payload(("messages", meta_value(messages=[msg], contacts=[contact]))))


# Also run on a Citus cluster (make test-citus): the identities' upsert there.
pytestmark = pytest.mark.citus


async def test_a_username_user_is_seen_by_handlers_and_destinations_and_answered_by_bsuid(
    pool: asyncpg.Pool, settings: Settings, fake: FakeProvider, receiver: FakeReceiver
) -> None:
    s = fast(send_settings(settings, fake))
    await add(pool, "bot", receiver.url, ("message",))
    seen: list[InboundMessage] = []
    registry = Registry()

    @registry.message()
    async def answer(event: InboundMessage, conn: Any) -> None:
        seen.append(event)
        await reply(conn, event, text="hello", bot="greeter")

    fake.add_customer(Customer(BSUID, wa_id=None, username="ana.b", name="Ana"))
    await stage(
        pool,
        inbound("wamid.U1", sender=None, user_id=BSUID, contact=contact_obj(None, BSUID, username="ana.b")),
    )
    assert await Consumer(pool, s, handlers=registry).step() == 1

    (event,) = seen
    assert (event.sender, event.user_id, event.username, event.contact_name) == (None, BSUID, "ana.b", "Ana")
    stored = await pool.fetchrow("SELECT sender, user_id, username, waba_id, contact FROM inbound_messages")
    assert dict(stored) == {
        "sender": None,
        "user_id": BSUID,
        "username": "ana.b",
        "waba_id": "waba-0",
        "contact": contact_obj(None, BSUID, username="ana.b"),
    }

    async with forwarding(pool, s):
        await until(lambda: _processed(receiver, 1), what="the destination to get the message")
    (delivered,) = receiver.state.processed.values()
    assert delivered["data"]["from"] is None
    assert (delivered["data"]["from_user_id"], delivered["data"]["username"]) == (BSUID, "ana.b")

    # The handler's reply goes to the BSUID, in Meta's "recipient" field.
    sender = Sender(pool, s, clock=FakeClock())
    try:
        assert await sender.step() == 1
    finally:
        await sender.close()
    (got,) = fake.received
    assert (got.to, got.addressed_by) == (BSUID, "recipient")
    assert got.message["context"] == {"message_id": "wamid.U1"}


async def _processed(receiver: FakeReceiver, n: int) -> bool:
    return len(receiver.state.processed) >= n


async def test_the_phone_number_and_the_bsuid_of_one_customer_are_paced_as_one_pair(
    pool: asyncpg.Pool, settings: Settings, fake: FakeProvider
) -> None:
    s = send_settings(settings, fake, pair_interval_s=6.0)
    # A message from the customer shows their phone number and BSUID together.
    await stage(pool, inbound("wamid.P1", sender=PHONE, user_id=BSUID, contact=contact_obj(PHONE, BSUID)))
    await drain(pool, s)
    assert await pool.fetchval("SELECT wa_id FROM customer_ids WHERE user_id = $1", BSUID) == PHONE
    # Another customer's BSUID on the same business number is paced on its own.
    await enqueue(pool, "other", "US.999")
    await enqueue(pool, "by-phone", PHONE)
    await enqueue(pool, "by-bsuid", BSUID)
    clock = FakeClock()
    sender = Sender(pool, s, clock=clock)
    try:
        await sender.step()
        assert [r.to for r in fake.received] == ["US.999", PHONE]
        second = await row(pool, "by-bsuid")
        assert second["state"] == "pending"
        assert second["next_attempt_at"].timestamp() >= clock.now() + 5.9
        clock.advance(6.0)
        await sender.step()
    finally:
        await sender.close()
    assert [r.to for r in fake.received][-1] == BSUID


async def test_statuses_of_a_send_to_a_bsuid_are_recorded_with_the_identity_fields(
    pool: asyncpg.Pool, settings: Settings, fake: FakeProvider, http: Any, start_gateway: Any
) -> None:
    s = send_settings(settings, fake, run_consumers=True, consumer_poll_ms=50)
    gw = await start_gateway(s)
    fake.config.webhook_url = str(gw.make_url("")).rstrip("/")
    fake.add_customer(Customer(BSUID, wa_id=PHONE, username="ana.b", share_phone=False))
    await enqueue(pool, "k1", BSUID)
    sender = Sender(pool, s, clock=FakeClock())
    try:
        await sender.step()
    finally:
        await sender.close()
    await fake.drain_webhooks()

    async def recorded() -> bool:
        return await pool.fetchval("SELECT count(*) FROM message_statuses") == 3

    await until(recorded, what="three statuses")
    rows = await pool.fetch(
        "SELECT status, recipient, recipient_user_id, recipient_username, phone_number_id, contact "
        "FROM message_statuses ORDER BY delivery_rank(status)"
    )
    assert [(r["status"], r["recipient"], r["recipient_user_id"]) for r in rows] == [
        ("sent", None, BSUID),
        ("delivered", None, BSUID),
        ("read", None, BSUID),
    ]
    assert [r["recipient_username"] for r in rows] == [None, "ana.b", "ana.b"]
    assert all(r["phone_number_id"] == "1111" and r["contact"]["user_id"] == BSUID for r in rows)
    assert (await row(pool, "k1"))["delivery_status"] == "read"
