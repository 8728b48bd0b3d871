"""Every send attempt's outcome is kept (a send's story in the console): written by the
outbox's statement trigger whoever moves a row out of 'sending'."""

from __future__ import annotations

import asyncpg

from gateway.core.settings import Settings
from gateway.outbound.sender import Sender
from gateway.testing.fake_provider import FakeProvider
from tests.support.send import FakeClock, enqueue, send_settings

TO = "4915100000001"


async def test_each_attempt_and_its_answer_is_kept_in_order(
    settings: Settings, pool: asyncpg.Pool, fake: FakeProvider
) -> None:
    await enqueue(pool, "a1", TO)
    await enqueue(pool, "a2", "4915100000002")
    fake.add_fault("error", to=TO, code=131000, times=1)  # retryable: back to pending
    fake.add_fault("error", to="4915100000002", code=131026)  # permanent: failed
    clock = FakeClock()
    sender = Sender(pool, send_settings(settings, fake), clock=clock)
    try:
        for _ in range(20):
            await sender.step()
            clock.advance(30)
    finally:
        await sender.close()
    rows = await pool.fetch(
        "SELECT o.idem_key, a.outcome, a.code, a.wamid IS NOT NULL, a.sent_at IS NOT NULL"
        " FROM outbox_attempts a JOIN outbox o ON o.id = a.outbox_id ORDER BY o.idem_key, a.at"
    )
    assert [tuple(r) for r in rows] == [
        ("a1", "pending", 131000, False, True),
        ("a1", "accepted", None, True, True),
        ("a2", "failed", 131026, False, True),
    ]
    # Statements that do not move a row out of 'sending' write nothing.
    await pool.execute("UPDATE outbox SET updated_at = now()")
    assert await pool.fetchval("SELECT count(*) FROM outbox_attempts") == 3
    # Retention deletes a send with its attempts.
    await pool.execute("DELETE FROM outbox WHERE idem_key = 'a2'")
    assert await pool.fetchval("SELECT count(*) FROM outbox_attempts") == 2
