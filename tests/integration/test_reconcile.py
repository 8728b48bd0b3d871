"""Sends whose fate is unknown, and what operators decide: the reconciler's policies, the
processed-webhook watermark it waits for, and release/cancel, which never send a row that
reached the provider again (the sender against the fake provider, on a controllable clock).
Also run on a Citus cluster (make test-citus)."""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest
from aiohttp.test_utils import TestServer
from prometheus_client import REGISTRY

from gateway.core.settings import Settings
from gateway.maintenance.reconciler import Reconciler
from gateway.outbound.sender import Sender
from gateway.store import outbox
from gateway.testing.fake_provider import FakeProvider
from tests.support.consume import dead_row, read_all
from tests.support.send import (
    TO,
    WINDOW,
    FakeClock,
    apply_statuses_from_inbox,
    drain_sender,
    enqueue,
    reconcile,
    row,
    send_settings,
)

pytestmark = pytest.mark.citus


async def test_policy_resend_resends_once_then_review(
    settings: Settings, pool: asyncpg.Pool, fake: FakeProvider
) -> None:
    clock = FakeClock()
    callback = await enqueue(pool, "r1", TO, policy="resend")
    fake.add_fault("http", status=502, times=2)
    sender = Sender(pool, send_settings(settings, fake), clock=clock, rand=lambda: 0.5)
    try:
        await sender.step()
        assert (await row(pool, "r1"))["state"] == "unknown"
        clock.advance(WINDOW - 1)
        assert (await reconcile(sender))["reconciled"] == 0  # not before the window
        clock.advance(2)
        assert (await reconcile(sender))["reconciled"] == 1
        r = await row(pool, "r1")
        assert (r["state"], r["resent"]) == ("pending", True)
        await sender.step()
        assert (await row(pool, "r1"))["state"] == "unknown"
        clock.advance(WINDOW + 1)
        await reconcile(sender)
        assert (await row(pool, "r1"))["state"] == "review"  # the one resend is used up
        assert await drain_sender(sender) is None
    finally:
        await sender.close()
    assert fake.count(callback) == 0


async def test_operator_release_and_cancel(
    settings: Settings, pool: asyncpg.Pool, fake: FakeProvider
) -> None:
    clock = FakeClock()
    cb1 = await enqueue(pool, "op1", TO)
    cb2 = await enqueue(pool, "op2", "4915100000002")
    await pool.execute("UPDATE outbox SET state = 'review'")
    async with pool.acquire() as conn:
        assert "now pending" in await outbox.release(conn, "op1", window_s=WINDOW)
        assert "now cancelled" in await outbox.cancel(conn, "op2", "acme")
        with pytest.raises(ValueError):
            await outbox.release(conn, "op2", window_s=WINDOW)  # cancelled stays cancelled
        with pytest.raises(LookupError):
            await outbox.cancel(conn, "nope")
    sender = Sender(pool, send_settings(settings, fake), clock=clock)
    try:
        await drain_sender(sender)
    finally:
        await sender.close()
    assert (fake.count(cb1), fake.count(cb2)) == (1, 0)


async def test_resend_waits_for_staged_status_webhook(
    settings: Settings, pool: asyncpg.Pool, fake: FakeProvider, start_gateway: Any
) -> None:
    """Policy resend; the send was accepted but its answer lost; the status webhook is staged
    but not consumed when the window ends: the reconciler waits instead of resending, and the
    status, once processed, settles the row. The customer gets one message."""
    gw: TestServer = await start_gateway(settings)
    fake.config.webhook_url = str(gw.make_url("")).rstrip("/")
    clock = FakeClock()
    callback = await enqueue(pool, "w1", TO, policy="resend")
    fake.add_fault("hang")
    sender = Sender(pool, send_settings(settings, fake), clock=clock, rand=lambda: 0.5)
    try:
        await sender.step()
        assert (await row(pool, "w1"))["state"] == "unknown"
        await fake.drain_webhooks()
        assert await pool.fetchval("SELECT count(*) FROM inbox_row_states() WHERE state = 'pending'") >= 1
        clock.advance(WINDOW + 1)
        counts = await reconcile(sender)
        assert (counts["reconciled"], counts["waiting"]) == (0, 1)
        assert (await row(pool, "w1"))["state"] == "unknown"
        assert REGISTRY.get_sample_value("gateway_reconcile_waiting_rows") == 1
        lag = REGISTRY.get_sample_value("gateway_reconcile_watermark_lag_seconds")
        assert lag is not None and lag >= WINDOW  # the staged status is older than the window
        await drain_sender(sender)
        assert fake.count(callback) == 1
        await apply_statuses_from_inbox(pool, settings)  # the consumers catch up
        counts = await reconcile(sender)
        assert (counts["reconciled"], counts["waiting"]) == (0, 0)
        assert REGISTRY.get_sample_value("gateway_reconcile_waiting_rows") == 0
        assert REGISTRY.get_sample_value("gateway_reconcile_watermark_lag_seconds") == 0
        await drain_sender(sender)
    finally:
        await sender.close()
    r = await row(pool, "w1")
    assert r["state"] == "accepted" and r["wamid"] == fake.received[0].id
    assert fake.count(callback) == 1


async def test_resend_waits_for_dead_webhook(
    settings: Settings, pool: asyncpg.Pool, fake: FakeProvider, start_gateway: Any
) -> None:
    """A dead webhook of the row's period holds the reconciler too (it may be the status);
    webhooks older than the row do not."""
    clock = FakeClock()
    await dead_row(pool, b"x")
    await enqueue(pool, "d1", TO, policy="resend")
    fake.add_fault("http", status=502)
    sender = Sender(pool, send_settings(settings, fake), clock=clock, rand=lambda: 0.5)
    try:
        await sender.step()
        assert (await row(pool, "d1"))["state"] == "unknown"
        await dead_row(pool, b"y")
        clock.advance(WINDOW + 1)
        counts = await reconcile(sender)
        assert (counts["reconciled"], counts["waiting"]) == (0, 1)
        await pool.execute("UPDATE inbox_parked SET state = 'done' WHERE body = 'y'")
        counts = await reconcile(sender)
        assert (counts["reconciled"], counts["waiting"]) == (1, 0)  # the older dead row does not hold it
        assert (await row(pool, "d1"))["state"] == "pending"
    finally:
        await sender.close()


@pytest.mark.parametrize("state", ["unknown", "failed", "review"])
async def test_a_row_that_reached_the_provider_is_never_released(
    state: str, settings: Settings, pool: asyncpg.Pool
) -> None:
    await enqueue(pool, "x1", TO, policy="resend")
    await enqueue(pool, "x2", TO, policy="resend")
    await pool.execute(
        "UPDATE outbox SET state = $1, unknown_at = now() - interval '1 day',"
        " wamid = CASE WHEN idem_key = 'x1' THEN 'wamid.X' END,"
        " delivery_status = CASE WHEN idem_key = 'x2' THEN 'failed' END",
        state,
    )
    async with pool.acquire() as conn:
        with pytest.raises(ValueError, match=r"wamid\.X.*sent twice"):
            await outbox.release(conn, "x1", window_s=WINDOW)
        with pytest.raises(ValueError, match="delivery status 'failed'"):
            await outbox.release(conn, "x2", window_s=WINDOW)
        bulk = await outbox.release_bulk(
            conn, state=state, since=None, until=None, tenant=None, window_s=WINDOW
        )
        assert (bulk.done, bulk.refused) == (0, 2)
    clock = FakeClock()
    assert (await Reconciler(pool, settings, clock=clock).run_once())["reconciled"] == (
        state == "unknown"
    ) * 2
    assert {r["state"] for r in await pool.fetch("SELECT state FROM outbox")} == {
        "review" if state == "unknown" else state
    }


async def test_reconciler_forgets_old_pacing_keys(settings: Settings, pool: asyncpg.Pool) -> None:
    clock = FakeClock()
    await pool.execute(
        "INSERT INTO send_pacing (key, at) VALUES ('pair:meta:1:old', $1), ('pair:meta:1:new', $2)",
        clock.now() - 7200,
        clock.now() - 60,
    )
    counts = await Reconciler(pool, settings, clock=clock).run_once()
    assert counts["pacing_keys_forgotten"] == 1
    assert [r["key"] for r in await pool.fetch("SELECT key FROM send_pacing")] == ["pair:meta:1:new"]


async def test_release_waits_while_webhooks_of_the_period_are_unprocessed(
    settings: Settings, pool: asyncpg.Pool
) -> None:
    """An operator's release of a review/unknown row would resend it; while a webhook received
    since the row was created is pending or dead, its status may be there: not yet."""
    await dead_row(pool, b"old")
    await enqueue(pool, "u1", TO)
    await enqueue(pool, "u2", "4915100000002")
    await pool.execute("UPDATE outbox SET state = 'review'")
    await pool.execute("INSERT INTO webhook_inbox (source, body) VALUES ('meta', 'new')")
    async with pool.acquire() as conn:
        with pytest.raises(ValueError, match="1 pending and 0 dead webhook"):
            await outbox.release(conn, "u1", window_s=WINDOW)
        bulk = await outbox.release_bulk(
            conn, state="review", since=None, until=None, tenant=None, window_s=WINDOW
        )
        assert (bulk.done, bulk.refused, bulk.waiting) == (0, 0, 2)
        await read_all(conn)
        assert "now pending" in await outbox.release(
            conn, "u1", window_s=WINDOW
        )  # the older dead row does not hold it
        bulk = await outbox.release_bulk(
            conn, state="review", since=None, until=None, tenant=None, window_s=WINDOW
        )
        assert (bulk.done, bulk.refused, bulk.waiting) == (1, 0, 0)


async def test_resend_waits_for_a_status_event_that_failed_on_its_own(
    settings: Settings, pool: asyncpg.Pool, fake: FakeProvider
) -> None:
    """A status that failed alone (its POST processed, its inbox row done, the event in
    dead_events) is as unprocessed as a pending row: the reconciler waits for it. A message
    that failed alone proves no delivery and does not hold it."""
    clock = FakeClock()
    await enqueue(pool, "e1", TO, policy="resend")
    fake.add_fault("http", status=502)
    sender = Sender(pool, send_settings(settings, fake), clock=clock, rand=lambda: 0.5)
    item = (
        "INSERT INTO dead_events (inbox_id, position, path, event_key, kind, source, received_at, unit,"
        " fragment, state) VALUES (1, 0, $1, $2, $3, 'meta', clock_timestamp(), $3, '{}', $4)"
    )
    try:
        await sender.step()
        assert (await row(pool, "e1"))["state"] == "unknown"
        await pool.execute(item, "/m", "msg:w", "message", "dead")
        await pool.execute(item, "/s", "status:w:read:", "status", "retry")
        clock.advance(WINDOW + 1)
        counts = await reconcile(sender)
        assert (counts["reconciled"], counts["waiting"]) == (0, 1)
        await pool.execute("UPDATE dead_events SET state = 'done' WHERE kind = 'status'")
        counts = await reconcile(sender)
        assert (counts["reconciled"], counts["waiting"]) == (1, 0)
        assert (await row(pool, "e1"))["state"] == "pending"
    finally:
        await sender.close()
