"""An unknown send is not released inside its reconcile window (GATEWAY_RECONCILE_WINDOW_S from
when its fate became unknown: its status may still come, and a release then sends it twice),
one row or in bulk, unless the operator says the customer may get it twice; the audit log
records either. (With a SIGKILLed sender and the CLI: tests/process/test_release_unknown.py.)"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from gateway.core.settings import Settings
from gateway.operator import actions
from gateway.operator.actions import Actor
from gateway.outbound.sender import Sender
from gateway.store import audit, outbox
from gateway.testing.fake_provider import FakeProvider
from tests.support.send import TO, WINDOW, FakeClock, enqueue, row, send_settings

pytestmark = pytest.mark.citus

BOB = Actor("bob", "cli")


async def unknown_since(pool: asyncpg.Pool, key: str, seconds_ago: float) -> datetime:
    at: datetime = await pool.fetchval(
        "UPDATE outbox SET state = 'unknown', unknown_at = now() - make_interval(secs => $2)"
        " WHERE idem_key = $1 RETURNING unknown_at",
        key,
        seconds_ago,
    )
    return at


async def entries(pool: asyncpg.Pool) -> list[audit.Entry]:
    return await audit.page(pool, before=None, actor=None, action=None, limit=100)


@pytest.mark.parametrize("ago", [0, 30, WINDOW - 5])
async def test_an_unknown_row_inside_its_window_is_refused_saying_when(pool: asyncpg.Pool, ago: int) -> None:
    await enqueue(pool, "u1")
    since = await unknown_since(pool, "u1", ago)
    async with pool.acquire() as conn:
        with pytest.raises(outbox.TooEarly) as refused:
            await actions.release(conn, BOB, "u1", window_s=WINDOW)
    at = since + timedelta(seconds=WINDOW)
    assert refused.value.at == at
    assert f"may be released from {at.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC" in str(refused.value)
    assert "GATEWAY_RECONCILE_WINDOW_S" in str(refused.value)
    assert (await row(pool, "u1"))["state"] == "unknown"
    [e] = await entries(pool)
    assert (e.action, e.rows) == ("outbox.release", 0) and e.outcome.startswith("refused: ")
    assert "may be released from" in e.outcome and "may_duplicate" not in e.params


async def test_past_its_window_it_is_released(pool: asyncpg.Pool) -> None:
    await enqueue(pool, "u2")
    await unknown_since(pool, "u2", WINDOW + 1)
    async with pool.acquire() as conn:
        assert "now pending" in await actions.release(conn, BOB, "u2", window_s=WINDOW)


async def test_a_row_the_sender_made_unknown_is_refused_at_once(
    settings: Settings, pool: asyncpg.Pool, fake: FakeProvider
) -> None:
    """Made unknown by the sender itself (the provider answered 502: it may have sent it)."""
    await enqueue(pool, "u3", TO)
    fake.add_fault("http", status=502)
    sender = Sender(pool, send_settings(settings, fake), clock=FakeClock(), rand=lambda: 0.5)
    try:
        await sender.step()
        assert (await row(pool, "u3"))["state"] == "unknown"
        async with pool.acquire() as conn:
            with pytest.raises(outbox.TooEarly):
                await actions.release(conn, BOB, "u3", window_s=WINDOW)
        assert await sender.step() == 0  # nothing due: no second request
    finally:
        await sender.close()
    assert (await row(pool, "u3"))["state"] == "unknown"


async def test_the_confirmation_releases_it_and_the_audit_log_records_it(pool: asyncpg.Pool) -> None:
    await enqueue(pool, "u4")
    since = await unknown_since(pool, "u4", 30)
    async with pool.acquire() as conn:
        text = await actions.release(conn, BOB, "u4", window_s=WINDOW, may_duplicate=True)
    assert "now pending" in text and "accepted that it may be sent twice" in text
    assert f"{(since + timedelta(seconds=WINDOW)).astimezone(UTC):%H:%M:%S} UTC" in text
    [e] = await entries(pool)
    assert (e.actor, e.action, e.rows, e.params["may_duplicate"]) == ("bob", "outbox.release", 1, True)
    assert e.outcome == text


async def test_the_confirmation_does_not_override_the_other_refusals(pool: asyncpg.Pool) -> None:
    await enqueue(pool, "u5")
    await unknown_since(pool, "u5", 30)
    await pool.execute("UPDATE outbox SET wamid = 'wamid.ACCEPTED'")
    async with pool.acquire() as conn:
        with pytest.raises(ValueError, match="sent twice"):
            await actions.release(conn, BOB, "u5", window_s=WINDOW, may_duplicate=True)
    await pool.execute("UPDATE outbox SET wamid = NULL")
    await pool.execute("INSERT INTO webhook_inbox (source, body) VALUES ('meta', 'a status, maybe')")
    async with pool.acquire() as conn:
        with pytest.raises(ValueError, match="1 pending and 0 dead webhook"):
            await actions.release(conn, BOB, "u5", window_s=WINDOW, may_duplicate=True)
    assert (await row(pool, "u5"))["state"] == "unknown"


async def test_bulk_release_holds_the_rows_inside_their_window(pool: asyncpg.Pool) -> None:
    for key in ("b1", "b2", "b3"):
        await enqueue(pool, key)
    newest = await unknown_since(pool, "b1", 10)
    oldest = await unknown_since(pool, "b2", 300)
    await unknown_since(pool, "b3", WINDOW + 10)
    async with pool.acquire() as conn:
        done = await actions.outbox_bulk(
            conn, BOB, "release", state="unknown", since=None, until=None, tenant=None, window_s=WINDOW
        )
    assert (done.done, done.refused, done.waiting, done.early) == (1, 0, 0, 2)
    assert (done.early_first, done.early_last) == (
        oldest + timedelta(seconds=WINDOW),
        newest + timedelta(seconds=WINDOW),
    )
    lines = actions.bulk_lines("released", done)
    assert any(line.startswith("2 row(s) not released yet: unknown for less than") for line in lines)
    pending = await pool.fetch("SELECT idem_key FROM outbox WHERE state = 'pending'")
    assert [r["idem_key"] for r in pending] == ["b3"]
    async with pool.acquire() as conn:
        forced = await actions.outbox_bulk(
            conn, BOB, "release", state="unknown", since=None, until=None, tenant=None, window_s=WINDOW,
            may_duplicate=True,
        )  # fmt: skip
    assert (forced.done, forced.early, forced.released_early) == (2, 0, 2)
    logged = await entries(pool)
    assert [(e.action, e.rows, e.params.get("may_duplicate")) for e in logged] == [
        ("outbox.release_bulk", 2, True),
        ("outbox.release_bulk", 1, None),
    ]
    assert "2 of them released inside their reconcile window" in logged[0].outcome
