"""Tenashi honours an Idempotency-Key for 24 hours: no send is retried later than the key window
(GATEWAY_TENASHI_KEY_WINDOW_H, 23 h by default) after its first attempt that may have reached
Tenashi; such rows go to review with the reason, and a release refuses them with it. The request
body is the one Tenashi documents."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import asyncpg
import orjson
import pytest
from aiohttp import web

from gateway.core.settings import Settings
from gateway.maintenance.reconciler import Reconciler
from gateway.operator import actions
from gateway.outbound.sender import Sender
from gateway.store import outbox
from gateway.testing.fake_provider import FakeConfig, FakeProvider
from tests.support.http import recorder

HOUR = 3600.0
CLI = actions.Actor("tester", "cli")


class Clock:
    def __init__(self) -> None:
        self.t = time.time() + 5.0

    def now(self) -> float:
        return self.t


@pytest.fixture
async def fake() -> AsyncIterator[FakeProvider]:
    f = FakeProvider(FakeConfig(seed=5))
    await f.start()
    yield f
    await f.stop()


def tenashi(settings: Settings, url: str, **kw: Any) -> Settings:
    base: dict[str, Any] = {
        "tenashi_url": url,
        "tenashi_token": "tenashi-token",
        "tenant_providers": (("acme", "tenashi"),),
        "send_connect_timeout_ms": 300,
        "send_read_timeout_ms": 300,
        "retry_base_ms": 1000,
        "retry_max_ms": 60_000,
        "tenashi_number_interval_s": 0.0,
        "pair_interval_s": 0.0,
    }
    return dataclasses.replace(settings, **{**base, **kw})


async def enqueue(pool: asyncpg.Pool, key: str, policy: str = "review") -> None:
    m = outbox.NewMessage(
        tenant="acme",
        key=key,
        provider="tenashi",
        phone_number_id="1111",
        recipient="919811122233",
        payload={"type": "text", "text": {"body": "Payment of 900 EUR received"}},
        unknown_policy=policy,
    )
    await outbox.enqueue(pool, m)


async def state(pool: asyncpg.Pool, key: str) -> asyncpg.Record:
    r = await outbox.get(pool, tenant="acme", key=key)
    assert r is not None
    return r


async def test_the_request_body_is_the_one_tenashi_documents(pool: asyncpg.Pool, settings: Settings) -> None:
    accepted = {"id": "msg_1", "status": "accepted"}
    async with recorder(lambda: web.json_response(accepted, status=202), "/api/v1/messages") as (url, seen):
        await enqueue(pool, "order-1042-shipped")
        sender = Sender(pool, tenashi(settings, url))
        try:
            await sender.step()
        finally:
            await sender.close()
    ((headers, raw),) = [(p.headers, p.body) for p in seen]
    assert orjson.loads(raw) == {"to": "+919811122233", "text": "Payment of 900 EUR received"}
    assert headers["Idempotency-Key"] == "acme:order-1042-shipped"
    assert headers["Authorization"] == "Bearer tenashi-token"
    assert (await state(pool, "order-1042-shipped"))["state"] == "accepted"


async def test_no_retry_past_the_key_window_after_an_attempt_that_may_have_reached_tenashi(
    pool: asyncpg.Pool, settings: Settings, fake: FakeProvider
) -> None:
    clock = Clock()
    s = tenashi(settings, fake.url)
    await enqueue(pool, "pay-900")
    fake.add_fault("hang")  # Tenashi takes the message, the answer never comes
    sender = Sender(pool, s, clock=clock, rand=lambda: 0.5)
    try:
        await sender.step()
        assert (await state(pool, "pay-900"))["state"] == "pending"  # retried with the same key
        # Tenashi is unreachable for a day (connect failures never reached it: retried).
        later = clock.t + 24 * HOUR
        await pool.execute("UPDATE outbox SET next_attempt_at = to_timestamp($1)", later)
        clock.t += 24 * HOUR
        requests = fake.requests
        assert await sender.step() == 1
        assert fake.requests == requests  # not attempted
        r = await state(pool, "pay-900")
        assert r["state"] == "review"
        assert "could send it twice" in r["last_error"]
        assert "honours its Idempotency-Key only until" in r["last_error"]
    finally:
        await sender.close()
    assert len(fake.received) == 1  # the customer got it once
    # The window runs from the first attempt that may have reached Tenashi.
    assert r["retry_until"] == r["ambiguous_at"] + timedelta(hours=23)
    assert r["ambiguous_at"].timestamp() == pytest.approx(clock.t - 24 * HOUR, abs=1)


async def test_within_the_window_a_retry_with_the_same_key_is_answered_by_the_replay(
    pool: asyncpg.Pool, settings: Settings, fake: FakeProvider
) -> None:
    clock = Clock()
    await enqueue(pool, "pay-1")
    fake.add_fault("hang")
    sender = Sender(pool, tenashi(settings, fake.url), clock=clock, rand=lambda: 0.5)
    try:
        await sender.step()
        clock.t += 120
        await sender.step()
    finally:
        await sender.close()
    r = await state(pool, "pay-1")
    assert r["state"] == "accepted" and len(fake.received) == 1 and r["wamid"] == fake.received[0].id


async def test_a_sender_that_died_mid_request_starts_the_window_and_resend_cannot_outlive_it(
    pool: asyncpg.Pool, settings: Settings, fake: FakeProvider
) -> None:
    clock = Clock()
    s = tenashi(settings, fake.url)
    await enqueue(pool, "pay-2", policy="resend")
    # A sender marked it sending and died: the reconciler finds it past the lease.
    await pool.execute(
        "UPDATE outbox SET state = 'sending', sending_at = to_timestamp($1) WHERE idem_key = 'pay-2'", clock.t
    )
    clock.t += s.send_lease_s + 1
    await Reconciler(pool, s, clock=clock).run_once()
    r = await state(pool, "pay-2")
    assert r["state"] == "unknown" and r["ambiguous_at"] == r["sending_at"]
    # Resend after the window: the claim parks it for a person instead of sending.
    clock.t += 24 * HOUR
    await Reconciler(pool, s, clock=clock).run_once()
    assert (await state(pool, "pay-2"))["state"] == "pending"
    sender = Sender(pool, s, clock=clock)
    try:
        await sender.step()
    finally:
        await sender.close()
    assert (await state(pool, "pay-2"))["state"] == "review" and fake.requests == 0


async def test_release_refuses_a_row_past_its_window_with_the_reason(
    pool: asyncpg.Pool, settings: Settings
) -> None:
    await enqueue(pool, "pay-3")
    await pool.execute(
        "UPDATE outbox SET state = 'review', ambiguous_at = now() - interval '25 hours',"
        " retry_until = now() - interval '2 hours' WHERE idem_key = 'pay-3'"
    )
    async with pool.acquire() as conn:
        with pytest.raises(ValueError, match="honours its Idempotency-Key only until"):
            await actions.release(conn, CLI, "pay-3", "acme", window_s=settings.reconcile_window_s)
        done = await actions.outbox_bulk(
            conn, CLI, "release", state="review", since=None, until=None, tenant=None,
            window_s=settings.reconcile_window_s,
        )  # fmt: skip
    assert (done.done, done.refused) == (0, 1)
    assert (await state(pool, "pay-3"))["state"] == "review"
    # Within its window a release goes through.
    await pool.execute("UPDATE outbox SET retry_until = now() + interval '1 hour' WHERE idem_key = 'pay-3'")
    async with pool.acquire() as conn:
        assert "released" in await actions.release(
            conn, CLI, "pay-3", "acme", window_s=settings.reconcile_window_s
        )
