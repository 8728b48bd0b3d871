"""Per-customer order and work-conserving pacing, with the real sender, database and fake provider
on a controllable clock: a customer's messages reach the provider in outbox order across claims,
retries, senders, unknown outcomes and operator decisions; nobody else waits for them."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import asyncpg

from gateway.core.enums import OutboxState
from gateway.core.pacing import number_key
from gateway.core.settings import Settings
from gateway.outbound.sender import Sender
from gateway.store import outbox, pacing
from gateway.testing.fake_provider import FakeProvider
from tests.support.send import FakeClock, enqueue, reconcile, row, send_settings

P, Q, R = "4915100000011", "4915100000012", "4915100000013"
BSUID = "US.13491208655302741918"


def bodies(fake: FakeProvider) -> list[str]:
    return [r.message["text"]["body"].removeprefix("hello ") for r in fake.received]


@contextlib.asynccontextmanager
async def sending(
    pool: asyncpg.Pool, settings: Settings, fake: FakeProvider, **changes: object
) -> AsyncIterator[Sender]:
    """A sender on a controllable clock; a refused send waits 20 s (the backoff's floor, no
    jitter): longer than the pair interval."""
    s = send_settings(settings, fake, retry_base_ms=40_000, **changes)
    sender = Sender(pool, s, clock=FakeClock(), rand=lambda: 0.0)
    try:
        yield sender
    finally:
        await sender.close()


def advance(sender: Sender, seconds: float) -> None:
    assert isinstance(sender.clock, FakeClock)
    sender.clock.advance(seconds)


async def run_for(sender: Sender, seconds: float, step_s: float = 0.5) -> None:
    """Claims every ``step_s`` of clock time for ``seconds`` (no sleeping)."""
    for _ in range(int(seconds / step_s)):
        await sender.step()
        advance(sender, step_s)


async def test_the_issue_sequence_nobody_waits_for_another_customer(
    settings: Settings, pool: asyncpg.Pool, fake: FakeProvider
) -> None:
    """P#1 P#2 Q#1 Q#2 R#1 due together: the first message of each goes in the first claim (before:
    Q#1 waited ~5 s and R#1 ~10 s for P#2's pair slot); the second ones 6 s later."""
    for key, to in (("P1", P), ("P2", P), ("Q1", Q), ("Q2", Q), ("R1", R)):
        await enqueue(pool, key, to)
    async with sending(pool, settings, fake) as sender:
        await sender.step()
        assert sorted(bodies(fake)) == ["P1", "Q1", "R1"]  # sent together: any arrival order
        await run_for(sender, 5.5)
        assert len(fake.received) == 3
        await run_for(sender, 1.0)
        assert sorted(bodies(fake)[3:]) == ["P2", "Q2"]


async def test_with_the_pair_limit_off_a_customers_next_message_goes_once_the_last_is_done(
    settings: Settings, pool: asyncpg.Pool, fake: FakeProvider
) -> None:
    """One message in flight per customer, in order; the next one is due when the send before it
    is recorded, not a recheck later (the clock does not move here)."""
    for key in ("P1", "P2", "P3"):
        await enqueue(pool, key, P)
    async with sending(pool, settings, fake, pair_interval_s=0.0) as sender:
        for n in (1, 2, 3):
            await sender.step()
            assert bodies(fake) == ["P1", "P2", "P3"][:n]


async def test_a_refused_message_keeps_its_place(
    settings: Settings, pool: asyncpg.Pool, fake: FakeProvider
) -> None:
    """P#1 refused (retry in 20 s): P#2 waits behind it, Q is not held. Before: P#2 went after the
    pair interval, 14 s before P#1."""
    fake.add_fault("error", to=P, code=131000)
    await enqueue(pool, "P1", P)
    await enqueue(pool, "P2", P)
    await enqueue(pool, "Q1", Q)
    async with sending(pool, settings, fake) as sender:
        await sender.step()
        assert bodies(fake) == ["Q1"]
        await run_for(sender, 19.0)
        assert bodies(fake) == ["Q1"]  # P#2 is held behind P#1's backoff
        await run_for(sender, 8.0)
    assert bodies(fake) == ["Q1", "P1", "P2"]


async def test_a_phone_number_and_a_bsuid_of_one_customer_keep_one_order(
    settings: Settings, pool: asyncpg.Pool, fake: FakeProvider
) -> None:
    await pool.execute(
        "INSERT INTO customer_ids (phone_number_id, user_id, wa_id) VALUES ('1111', $1, $2)", BSUID, P
    )
    fake.add_fault("error", to=P, code=131000)
    await enqueue(pool, "by-phone", P)
    await enqueue(pool, "by-bsuid", BSUID)
    async with sending(pool, settings, fake) as sender:
        await run_for(sender, 19.0)
        assert fake.received == []
        await run_for(sender, 8.0)
    assert [r.to for r in fake.received] == [P, BSUID]


async def test_an_earlier_row_another_sender_holds_keeps_the_later_one_back(
    settings: Settings, pool: asyncpg.Pool, fake: FakeProvider
) -> None:
    """SKIP LOCKED hides P#1 from this claim while another transaction holds it: P#2 must not go."""
    await enqueue(pool, "P1", P)
    await enqueue(pool, "P2", P)
    p1 = (await row(pool, "P1"))["id"]
    async with sending(pool, settings, fake) as sender:
        async with pool.acquire() as other, other.transaction():
            await other.execute("SELECT 1 FROM outbox WHERE id = $1 FOR UPDATE", p1)
            await sender.step()
            assert fake.received == []
            assert (await row(pool, "P2"))["state"] == "pending"
        await run_for(sender, 7.0)
    assert bodies(fake) == ["P1", "P2"]


async def test_a_row_its_killed_sender_left_sending_holds_the_pair_until_its_lease_ends(
    settings: Settings, pool: asyncpg.Pool, fake: FakeProvider
) -> None:
    """The claim committed, the process died before the request: P#1 may have gone. P#2 waits;
    once P#1 is unknown (policy review: never sent again by itself), P#2 goes."""
    await enqueue(pool, "P1", P)
    async with sending(pool, settings, fake) as sender:
        claimed = await sender._claim(sender.clock.now())
        assert [r["idem_key"] for r in claimed.rows] == ["P1"]
        await enqueue(pool, "P2", P)
        await run_for(sender, 30.0)
        assert fake.received == []
        advance(sender, sender.lease_s)
        assert (await reconcile(sender))["expired_sending"] == 1
        await run_for(sender, 1.0)
    assert bodies(fake) == ["P2"]


async def test_an_unknown_row_whose_resend_may_come_holds_the_pair(
    settings: Settings, pool: asyncpg.Pool, fake: FakeProvider
) -> None:
    """Policy resend: P#1's fate unknown, it may be sent again, so P#2 waits for it; policy
    review (Q): Q#2 goes after the pair interval."""
    fake.add_fault("drop", to=P)
    fake.add_fault("drop", to=Q)
    await enqueue(pool, "P1", P, policy="resend")
    await enqueue(pool, "P2", P)
    await enqueue(pool, "Q1", Q)
    await enqueue(pool, "Q2", Q)
    async with sending(pool, settings, fake, reconcile_window_s=60) as sender:
        await run_for(sender, 10.0)
        assert bodies(fake) == ["Q2"]
        assert (await row(pool, "P1"))["state"] == "unknown"
        await run_for(sender, 55.0)
        assert bodies(fake) == ["Q2"]
        await reconcile(sender)  # the window passed: P#1 back to pending (once), Q#1 to review
        assert [(await row(pool, k))["state"] for k in ("P1", "Q1")] == ["pending", "review"]
        await run_for(sender, 8.0)
    assert bodies(fake) == ["Q2", "P1", "P2"]


async def test_cancelled_and_released_rows(
    settings: Settings, pool: asyncpg.Pool, fake: FakeProvider
) -> None:
    """A cancelled row holds nobody; a row released to pending takes its place again among the
    pair's rows still pending (sent before those enqueued after it)."""
    fake.add_fault("error", to=P, code=131000)
    fake.add_fault("drop", to=Q)
    for key, to in (("P1", P), ("P2", P), ("Q1", Q), ("Q2", Q), ("Q3", Q)):
        await enqueue(pool, key, to)
    async with sending(pool, settings, fake, reconcile_window_s=60) as sender:
        await sender.step()  # P#1 refused (20 s), Q#1 dropped (unknown, policy review)
        assert await outbox.cancel_pending(pool, tenant="acme", key="P1") == (
            OutboxState.CANCELLED,
            True,
        )
        await run_for(sender, 6.5)
        assert sorted(bodies(fake)) == ["P2", "Q2"]  # Q#3 waits its pair interval after Q#2
        # An operator's decision, inside the reconcile window: explicitly accepting a duplicate.
        assert "released" in await outbox.release(pool, "Q1", "acme", window_s=60, may_duplicate=True)
        await run_for(sender, 14.0)
    assert [b for b in bodies(fake) if b.startswith("Q")] == ["Q2", "Q1", "Q3"]
    assert len(fake.received) == 4


async def run_sender(sender: Sender, until: Callable[[], Awaitable[bool]], timeout_s: float) -> None:
    """``sender.run`` (its loops, NOTIFY, its own waits) until ``until()`` or the timeout."""
    stop = asyncio.Event()
    task = asyncio.create_task(sender.run(stop))
    try:
        async with asyncio.timeout(timeout_s):
            while not await until():
                await asyncio.sleep(0.02)
    finally:
        stop.set()
        await task
        await sender.close()


async def test_a_row_put_off_goes_when_its_wait_ends_not_a_poll_later(
    settings: Settings, pool: asyncpg.Pool, fake: FakeProvider
) -> None:
    s = send_settings(settings, fake, pair_interval_s=1.0, send_poll_ms=60_000)
    await enqueue(pool, "P1", P)
    await enqueue(pool, "P2", P)

    async def both() -> bool:
        return len(fake.received) == 2

    await run_sender(Sender(pool, s), both, timeout_s=20)
    first, second = fake.received
    assert second.at - first.at >= 1.0 - 0.2


async def test_a_claim_that_met_another_claims_lock_looks_again_soon(
    settings: Settings, pool: asyncpg.Pool, fake: FakeProvider
) -> None:
    """The row's NOTIFY came while another sender's claim held its number: the claim that saw it
    looks again once that one is done, not a poll (here a minute) later."""
    s = send_settings(settings, fake, send_poll_ms=60_000)
    sender = Sender(pool, s)
    async with pool.acquire() as other:
        tx = other.transaction()
        await tx.start()
        await pacing.lock(other, [number_key("meta", "1111")])
        await enqueue(pool, "P1", P)

        stop = asyncio.Event()
        task = asyncio.create_task(sender.run(stop))
        await asyncio.sleep(1.0)  # woken by the NOTIFY, it found the number locked
        assert fake.received == []
        await tx.rollback()
    try:
        async with asyncio.timeout(10):
            while not fake.received:
                await asyncio.sleep(0.02)
    finally:
        stop.set()
        await task
        await sender.close()
