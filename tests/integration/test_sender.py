"""The sender against the fake provider over real HTTP, on a controllable clock."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import asyncpg
import pytest
from aiohttp.test_utils import TestServer
from prometheus_client import REGISTRY

from gateway.core.classify import PERMANENT_CODES, RETRYABLE_CODES
from gateway.core.settings import Settings
from gateway.outbound.sender import Sender
from gateway.store import outbox
from gateway.testing.fake_provider import FakeProvider
from gateway.testing.ports import closed_port
from tests.support.config import replace
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

# (fault, first state, received after the first attempt, how it resolves, final state, final received)
MATRIX: list[tuple[str, dict[str, Any] | None, str, int, str, str, int]] = [
    ("success", None, "accepted", 1, "none", "accepted", 1),
    ("latency", {"action": "latency", "latency_ms": 100}, "accepted", 1, "none", "accepted", 1),
    # The answer arrives in two pieces: read whole, not cut at the first.
    ("split answer", {"action": "split", "pause_ms": 50}, "accepted", 1, "none", "accepted", 1),
    # An answer of a megabyte is no Graph answer: not read past the bound, its fate unknown.
    ("oversized answer", {"action": "oversize", "size": 1024 * 1024}, "unknown", 1, "status", "accepted", 1),
    ("connection refused", None, "pending", 0, "retry", "accepted", 1),
    ("accept-then-hang", {"action": "hang"}, "unknown", 1, "status", "accepted", 1),
    ("accept-then-hang, no status", {"action": "hang"}, "unknown", 1, "reconcile", "review", 1),
    ("http 500", {"action": "http", "status": 500}, "unknown", 0, "reconcile", "review", 0),
    ("http 503", {"action": "http", "status": 503}, "unknown", 0, "reconcile", "review", 0),
    ("connection dropped", {"action": "drop"}, "unknown", 0, "reconcile", "review", 0),
    *[
        (f"retryable {c}", {"action": "error", "code": c}, "pending", 0, "retry", "accepted", 1)
        for c in sorted(RETRYABLE_CODES)
    ],
    *[
        (f"permanent {c}", {"action": "error", "code": c}, "failed", 0, "retry", "failed", 0)
        for c in sorted(PERMANENT_CODES | {131049})
    ],
]


@pytest.mark.parametrize(
    ("name", "fault", "first", "first_received", "resolve", "final", "final_received"),
    MATRIX,
    ids=[m[0] for m in MATRIX],
)
async def test_fault_matrix_meta(
    name: str,
    fault: dict[str, Any] | None,
    first: str,
    first_received: int,
    resolve: str,
    final: str,
    final_received: int,
    settings: Settings,
    pool: asyncpg.Pool,
    fake: FakeProvider,
    start_gateway: Any,
) -> None:
    # Status webhooks go to the real ingest edge; a stand-in applies them (the consumer's job).
    gw: TestServer = await start_gateway(settings)
    fake.config.webhook_url = str(gw.make_url("")).rstrip("/")
    clock = FakeClock()
    s = send_settings(settings, fake)
    if name == "connection refused":
        s_first = send_settings(settings, fake, graph_url=f"http://127.0.0.1:{closed_port()}/v21.0")
    else:
        s_first = s
    callback = await enqueue(pool, "k1", TO)
    if fault is not None:
        fake.add_fault(**fault)
    if name.endswith("no status"):
        fake.config.statuses = ()  # the status webhook never comes

    first_sender = Sender(pool, s_first, clock=clock, rand=lambda: 0.5)
    try:
        assert await first_sender.step() == 1
    finally:
        await first_sender.close()
    r = await row(pool, "k1")
    assert r["state"] == first
    assert fake.count(callback) == first_received
    if fault is not None and fault["action"] == "error":
        assert r["last_error_code"] == fault["code"]

    sender = Sender(pool, s, clock=clock, rand=lambda: 0.5)
    try:
        if resolve == "status":
            await fake.drain_webhooks()
            assert await apply_statuses_from_inbox(pool, settings) >= 1
            assert (await row(pool, "k1"))["state"] == "accepted"
        # Time passes well beyond backoff and the reconciliation window, then everything runs.
        clock.advance(WINDOW + 1)
        await reconcile(sender)
        await drain_sender(sender)
        clock.advance(WINDOW + 1)
        await reconcile(sender)
        await drain_sender(sender)
    finally:
        await sender.close()
    r = await row(pool, "k1")
    assert r["state"] == final
    assert fake.count(callback) == final_received
    assert fake.count(callback) <= 1  # at most once, always
    if final == "accepted":
        assert r["wamid"] == fake.received[0].id


TENASHI: list[tuple[str, dict[str, Any] | None, str, int]] = [
    ("success", None, "accepted", 1),
    # The answer is lost; the retry carries the same Idempotency-Key and gets the replay.
    ("accept-then-hang", {"action": "hang"}, "pending", 1),
    ("http 503", {"action": "http", "status": 503}, "pending", 0),
    ("connection dropped", {"action": "drop"}, "pending", 0),
]


@pytest.mark.parametrize(("name", "fault", "first", "first_received"), TENASHI, ids=[t[0] for t in TENASHI])
async def test_fault_matrix_tenashi(
    name: str,
    fault: dict[str, Any] | None,
    first: str,
    first_received: int,
    settings: Settings,
    pool: asyncpg.Pool,
    fake: FakeProvider,
) -> None:
    clock = FakeClock()
    s = send_settings(settings, fake, tenant_providers=(("acme", "tenashi"),))
    callback = await enqueue(pool, "t1", TO, provider="tenashi")
    if fault is not None:
        fake.add_fault(**fault)
    sender = Sender(pool, s, clock=clock, rand=lambda: 0.5)
    try:
        await sender.step()
        r = await row(pool, "t1")
        assert r["state"] == first
        assert fake.count(callback) == first_received
        clock.advance(120)
        await drain_sender(sender)
    finally:
        await sender.close()
    r = await row(pool, "t1")
    assert r["state"] == "accepted"
    assert fake.count(callback) == 1
    assert r["wamid"] == fake.received[0].id


async def test_stale_sending_becomes_unknown(
    settings: Settings, pool: asyncpg.Pool, fake: FakeProvider
) -> None:
    """A sender that died mid-request leaves 'sending'; after the lease the row is unknown, not resent."""
    clock = FakeClock()
    await enqueue(pool, "s1", TO)
    sender = Sender(pool, send_settings(settings, fake), clock=clock)
    try:
        await pool.execute("UPDATE outbox SET state = 'sending', sending_at = to_timestamp($1)", clock.now())
        clock.advance(sender.lease_s - 1)
        assert (await reconcile(sender))["expired_sending"] == 0
        clock.advance(2)
        assert (await reconcile(sender))["expired_sending"] == 1
        assert (await row(pool, "s1"))["state"] == "unknown"
        await drain_sender(sender)
    finally:
        await sender.close()
    assert fake.received == []


async def test_two_senders_race_each_row_sent_once(
    settings: Settings, pool: asyncpg.Pool, fake: FakeProvider, db_dsn: str
) -> None:
    from gateway.store.db import create_pool

    n = 300
    callbacks = [await enqueue(pool, f"race-{i}", f"49151{i:08d}") for i in range(n)]
    s = send_settings(settings, fake, send_batch=20, pair_interval_s=0.0, number_rate_per_s=1e6)
    pool2 = await create_pool(db_dsn, 1, 5)
    a, b = Sender(pool, s), Sender(pool2, s)
    try:
        await asyncio.gather(drain_sender(a), drain_sender(b), drain_sender(a), drain_sender(b))
    finally:
        await a.close()
        await b.close()
        await pool2.close()
    assert len(fake.received) == n
    assert sorted(r.callback_data or "" for r in fake.received) == sorted(callbacks)
    assert await pool.fetchval("SELECT count(*) FROM outbox WHERE state = 'accepted'") == n


async def test_pacing_ten_messages_to_one_recipient_six_seconds_apart(
    settings: Settings, pool: asyncpg.Pool, fake: FakeProvider
) -> None:
    clock = FakeClock()
    for i in range(10):
        await enqueue(pool, f"p{i}", TO)
    sender = Sender(pool, send_settings(settings, fake, pair_interval_s=6.0), clock=clock)
    try:
        await drain_sender(sender, clock, step_s=0.5, rounds=130)  # 65 s of clock time, no sleeping
    finally:
        await sender.close()
    got = [r.message["text"]["body"] for r in fake.received_by(TO)]
    assert got == [f"hello p{i}" for i in range(10)]  # all sent, in order, once
    times = [
        r["t"]
        for r in await pool.fetch(
            "SELECT extract(epoch FROM sending_at)::float8 AS t FROM outbox"
            " WHERE state = 'accepted' ORDER BY t"
        )
    ]
    assert len(times) == 10
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert min(gaps) >= 6.0 - 1e-6
    assert await pool.fetchval("SELECT max(attempts) FROM outbox") == 1  # deferrals are not attempts


async def test_metrics(settings: Settings, pool: asyncpg.Pool, fake: FakeProvider) -> None:

    def sample(name: str, **labels: str) -> float:
        return REGISTRY.get_sample_value(name, labels) or 0.0

    before_unknown = sample("gateway_sends_total", provider="meta", outcome="unknown", code="")
    before_failed = sample("gateway_sends_total", provider="meta", outcome="failed", code="131026")
    clock = FakeClock()
    await enqueue(pool, "m1", TO)
    await enqueue(pool, "m2", "4915100000002")
    fake.add_fault("http", to=TO, status=500)
    fake.add_fault("error", code=131026)
    sender = Sender(pool, send_settings(settings, fake), clock=clock)
    try:
        await sender.step()
        clock.advance(100)
        await reconcile(sender)
    finally:
        await sender.close()
    assert sample("gateway_sends_total", provider="meta", outcome="unknown", code="") == before_unknown + 1
    assert (
        sample("gateway_sends_total", provider="meta", outcome="failed", code="131026") == before_failed + 1
    )
    assert sample("gateway_outbox_rows", state="unknown") == 1
    assert sample("gateway_outbox_rows", state="failed") == 1
    assert sample("gateway_outbox_oldest_unknown_seconds") == pytest.approx(100, abs=1)


async def test_breaker_holds_rows_pending_then_probes_and_closes(
    settings: Settings, pool: asyncpg.Pool, fake: FakeProvider
) -> None:
    """368 (account blocked) on a number: its rows wait as pending (no attempt burned), one
    probe after the backoff, a failed probe doubles it, a good probe closes it and everything goes."""

    from gateway.maintenance import gauges

    def trips() -> float:
        labels = {"scope": "number", "provider": "meta", "code": "368"}
        return REGISTRY.get_sample_value("gateway_breaker_trips_total", labels) or 0.0

    before = trips()
    clock = FakeClock()
    callbacks = [await enqueue(pool, f"b{i}", f"49151000000{i:02d}") for i in range(5)]
    other = await enqueue(pool, "other", "4915100000099", number="2222")
    fake.add_fault("error", to="4915100000000", code=368, times=2)
    s = send_settings(settings, fake, send_batch=1, breaker_backoff_s=30.0)
    sender = Sender(pool, s, clock=clock, rand=lambda: 0.5)
    try:
        assert await sender.step() == 1  # b0: 368
        assert (await row(pool, "b0"))["state"] == "pending"
        await drain_sender(sender)  # number 2222 is not held
        assert fake.count(other) == 1
        await drain_sender(sender)  # every 1111 row waits for the probe
        assert len(fake.received) == 1
        clock.advance(31)
        await drain_sender(sender)  # the probe: 368 again, backoff doubles
        clock.advance(31)
        await drain_sender(sender)
        assert len(fake.received) == 1
        await gauges.refresh_outbox(pool)
        assert (
            REGISTRY.get_sample_value(
                "gateway_breaker_state", {"scope": "number", "provider": "meta", "key": "1111"}
            )
            == 2
        )
        clock.advance(30)
        await drain_sender(sender)  # the probe goes through: closed, and the rows it held are due
        await gauges.refresh_outbox(pool)
        assert (
            REGISTRY.get_sample_value(
                "gateway_breaker_state", {"scope": "number", "provider": "meta", "key": "1111"}
            )
            == 0
        )
    finally:
        await sender.close()
    assert [fake.count(c) for c in callbacks] == [1] * 5
    assert await pool.fetchval("SELECT count(*) FROM outbox WHERE state = 'accepted'") == 6
    assert await pool.fetchval("SELECT max(attempts) FROM outbox") == 1  # refusals were not attempts
    assert trips() == before + 2


async def test_token_breaker_is_per_token(settings: Settings, pool: asyncpg.Pool, fake: FakeProvider) -> None:
    """Numbers 1111 and 3333 share a token, 2222 has its own: a 190 (token expired) on 1111 holds
    1111's and 3333's rows, not 2222's."""
    clock = FakeClock()
    await enqueue(pool, "a1", "4915100000001", number="1111")
    await enqueue(pool, "a2", "4915100000002", number="3333")
    g = await enqueue(pool, "g1", "4915100000003", number="2222", tenant="globex")
    fake.add_fault("error", to="4915100000001", code=190)
    tokens = (("1111", "token-shared-1"), ("2222", "token-own-22"), ("3333", "token-shared-1"))
    s = send_settings(settings, fake, send_batch=1, graph_tokens=tokens)
    sender = Sender(pool, s, clock=clock, rand=lambda: 0.5)
    try:
        await drain_sender(sender)
    finally:
        await sender.close()
    assert fake.count(g) == 1
    assert [(await row(pool, k))["state"] for k in ("a1", "a2")] == ["pending", "pending"]
    b = await pool.fetchrow("SELECT * FROM send_breakers")
    breaker = (b["scope"], b["provider"], b["key"], b["state"], b["code"])
    assert breaker == ("token", "meta", "1111", "open", 190)


async def test_each_number_sends_with_its_own_token(
    settings: Settings, pool: asyncpg.Pool, fake: FakeProvider
) -> None:
    await enqueue(pool, "a1", "4915100000001", number="1111")
    await enqueue(pool, "b1", "4915100000002", number="2222")
    await enqueue(pool, "c1", "4915100000003", number="9999")  # no token of its own: the default
    tokens = (("1111", "token-of-1111"), ("2222", "token-of-2222"))
    s = send_settings(settings, fake, graph_token="default-token", graph_tokens=tokens)
    fake.config.number_tokens = dict(tokens)  # another token for 1111 or 2222 gets 190
    sender = Sender(pool, s, clock=FakeClock())
    try:
        await drain_sender(sender)
    finally:
        await sender.close()
    assert {r.phone_number_id: r.token for r in fake.received} == {
        "1111": "token-of-1111",
        "2222": "token-of-2222",
        "9999": "default-token",
    }


@pytest.mark.parametrize("dsn", [True, False], ids=["own connection", "pool connection"])
async def test_a_wake_after_the_enqueue_wakes_the_sender_and_the_listener_reconnects(
    dsn: bool, settings: Settings, pool: asyncpg.Pool, fake: FakeProvider
) -> None:
    """With a 60 s poll, only NOTIFY can get a send out within seconds (the send front ends'
    wake after their commit, as a process without a sender of its own sends it); after its
    LISTEN connection is killed the sender listens again. Without a DSN (the embedded database
    of a standalone `gateway send`) it listens on a connection held from its pool."""
    s = send_settings(settings, fake, send_poll_ms=60_000, pair_interval_s=0.0)
    if not dsn:
        s = replace(s, database_url=None)
    sender = Sender(pool, s)
    stop = asyncio.Event()
    task = asyncio.create_task(sender.run(stop))

    async def sent(callback: str) -> None:
        async with asyncio.timeout(10):
            while fake.count(callback) == 0:
                await asyncio.sleep(0.01)

    async def listening() -> int:
        n: int = await pool.fetchval(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE application_name = 'gateway LISTEN outbox' AND pid <> pg_backend_pid()"
        )
        return n

    try:
        async with asyncio.timeout(10):
            while await listening() == 0:
                await asyncio.sleep(0.02)
        n1 = await enqueue(pool, "n1", "4915100000001")
        await outbox.wake_senders(pool)
        await sent(n1)
        await pool.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE application_name = 'gateway LISTEN outbox'"
        )
        async with asyncio.timeout(10):
            while await listening() == 0:
                await asyncio.sleep(0.02)
        n2 = await enqueue(pool, "n2", "4915100000002")
        await outbox.wake_senders(pool)
        await sent(n2)
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
        await sender.close()
    assert len(fake.received) == 2


async def test_tenashi_number_interval_across_recipients(
    settings: Settings, pool: asyncpg.Pool, fake: FakeProvider
) -> None:
    """Tenashi sends one message per number per GATEWAY_TENASHI_NUMBER_INTERVAL_S, whoever the
    recipient; another number is not held."""
    clock = FakeClock()
    a = await enqueue(pool, "t1", "4915100000001", provider="tenashi")
    b = await enqueue(pool, "t2", "4915100000002", provider="tenashi")
    c = await enqueue(pool, "t3", "4915100000003", provider="tenashi", number="2222")
    s = send_settings(settings, fake, tenashi_number_interval_s=12.0)
    sender = Sender(pool, s, clock=clock)
    try:
        await drain_sender(sender)
        assert (fake.count(a), fake.count(b), fake.count(c)) == (1, 0, 1)
        clock.advance(11.9)
        await drain_sender(sender)
        assert fake.count(b) == 0
        clock.advance(0.2)
        await drain_sender(sender)
        assert fake.count(b) == 1
    finally:
        await sender.close()


async def test_tenashi_401_opens_the_token_breaker(
    settings: Settings, pool: asyncpg.Pool, fake: FakeProvider
) -> None:
    clock = FakeClock()
    cb = await enqueue(pool, "t401", "4915100000001", provider="tenashi")
    fake.add_fault("http", status=401)
    sender = Sender(pool, send_settings(settings, fake), clock=clock, rand=lambda: 0.5)
    try:
        await drain_sender(sender)
        r = await row(pool, "t401")
        assert (r["state"], r["attempts"]) == ("pending", 0)
        b = await pool.fetchrow("SELECT * FROM send_breakers")
        assert (b["scope"], b["provider"], b["key"], b["state"]) == ("token", "tenashi", "default", "open")
        clock.advance(settings.breaker_backoff_s + 1)
        await drain_sender(sender)  # the probe goes through
    finally:
        await sender.close()
    assert fake.count(cb) == 1
    assert (await row(pool, "t401"))["state"] == "accepted"
    assert await pool.fetchval("SELECT state FROM send_breakers") == "closed"
