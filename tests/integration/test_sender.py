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
from gateway.maintenance.reconciler import Reconciler
from gateway.outbound.sender import Sender
from gateway.store import outbox
from gateway.testing.fake_provider import FakeProvider
from gateway.testing.ports import closed_port
from tests.support.config import replace
from tests.support.send import (
    FakeClock,
    apply_statuses_from_inbox,
    enqueue,
    reconcile,
    row,
    send_settings,
)

TO = "4915100000001"
WINDOW = 600


async def drain(
    sender: Sender, clock: FakeClock | None = None, step_s: float = 0.0, rounds: int = 1000
) -> None:
    """Step until nothing is due (advancing the clock between steps when given)."""
    for _ in range(rounds):
        claimed = await sender.step()
        if clock is None:
            if claimed == 0:
                return
        else:
            clock.advance(step_s)
    if clock is None:
        raise AssertionError("sender never ran dry")


# (fault, first state, received after the first attempt, how it resolves, final state, final received)
MATRIX: list[tuple[str, dict[str, Any] | None, str, int, str, str, int]] = [
    ("success", None, "accepted", 1, "none", "accepted", 1),
    ("latency", {"action": "latency", "latency_ms": 100}, "accepted", 1, "none", "accepted", 1),
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
        await drain(sender)
        clock.advance(WINDOW + 1)
        await reconcile(sender)
        await drain(sender)
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
        await drain(sender)
    finally:
        await sender.close()
    r = await row(pool, "t1")
    assert r["state"] == "accepted"
    assert fake.count(callback) == 1
    assert r["wamid"] == fake.received[0].id


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
        assert await drain(sender) is None
    finally:
        await sender.close()
    assert fake.count(callback) == 0


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
        await drain(sender)
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
        await asyncio.gather(drain(a), drain(b), drain(a), drain(b))
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
        await drain(sender, clock, step_s=0.5, rounds=130)  # 65 s of clock time, no sleeping
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


async def test_operator_release_and_cancel(
    settings: Settings, pool: asyncpg.Pool, fake: FakeProvider
) -> None:
    clock = FakeClock()
    cb1 = await enqueue(pool, "op1", TO)
    cb2 = await enqueue(pool, "op2", "4915100000002")
    await pool.execute("UPDATE outbox SET state = 'review'")
    async with pool.acquire() as conn:
        assert "now pending" in await outbox.release(conn, "op1")
        assert "now cancelled" in await outbox.cancel(conn, "op2", "acme")
        with pytest.raises(ValueError):
            await outbox.release(conn, "op2")  # cancelled stays cancelled
        with pytest.raises(LookupError):
            await outbox.cancel(conn, "nope")
    sender = Sender(pool, send_settings(settings, fake), clock=clock)
    try:
        await drain(sender)
    finally:
        await sender.close()
    assert (fake.count(cb1), fake.count(cb2)) == (1, 0)


async def test_metrics(settings: Settings, pool: asyncpg.Pool, fake: FakeProvider) -> None:
    from prometheus_client import REGISTRY

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
        assert await pool.fetchval("SELECT count(*) FROM webhook_inbox WHERE state = 'pending'") >= 1
        clock.advance(WINDOW + 1)
        counts = await reconcile(sender)
        assert (counts["reconciled"], counts["waiting"]) == (0, 1)
        assert (await row(pool, "w1"))["state"] == "unknown"
        assert REGISTRY.get_sample_value("gateway_reconcile_waiting_rows") == 1
        lag = REGISTRY.get_sample_value("gateway_reconcile_watermark_lag_seconds")
        assert lag is not None and lag >= WINDOW  # the staged status is older than the window
        await drain(sender)
        assert fake.count(callback) == 1
        await apply_statuses_from_inbox(pool, settings)  # the consumers catch up
        counts = await reconcile(sender)
        assert (counts["reconciled"], counts["waiting"]) == (0, 0)
        assert REGISTRY.get_sample_value("gateway_reconcile_waiting_rows") == 0
        assert REGISTRY.get_sample_value("gateway_reconcile_watermark_lag_seconds") == 0
        await drain(sender)
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
    await pool.execute("INSERT INTO webhook_inbox (source, body, state) VALUES ('meta', 'x', 'dead')")
    await enqueue(pool, "d1", TO, policy="resend")
    fake.add_fault("http", status=502)
    sender = Sender(pool, send_settings(settings, fake), clock=clock, rand=lambda: 0.5)
    try:
        await sender.step()
        assert (await row(pool, "d1"))["state"] == "unknown"
        await pool.execute("INSERT INTO webhook_inbox (source, body, state) VALUES ('meta', 'y', 'dead')")
        clock.advance(WINDOW + 1)
        counts = await reconcile(sender)
        assert (counts["reconciled"], counts["waiting"]) == (0, 1)
        await pool.execute("UPDATE webhook_inbox SET state = 'done' WHERE body = 'y'")
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
            await outbox.release(conn, "x1")
        with pytest.raises(ValueError, match="delivery status 'failed'"):
            await outbox.release(conn, "x2")
        bulk = await outbox.release_bulk(conn, state=state, since=None, until=None, tenant=None)
        assert (bulk.done, bulk.refused) == (0, 2)
    clock = FakeClock()
    assert (await Reconciler(pool, settings, clock=clock).run_once())["reconciled"] == (
        state == "unknown"
    ) * 2
    assert {r["state"] for r in await pool.fetch("SELECT state FROM outbox")} == {
        "review" if state == "unknown" else state
    }


async def test_breaker_holds_rows_pending_then_probes_and_closes(
    settings: Settings, pool: asyncpg.Pool, fake: FakeProvider
) -> None:
    """368 (account blocked) on a number: its rows wait as pending (no attempt burned), one
    probe after the backoff, a failed probe doubles it, a good probe closes it and everything goes."""
    from prometheus_client import REGISTRY

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
        await drain(sender)  # number 2222 is not held
        assert fake.count(other) == 1
        await drain(sender)  # every 1111 row waits for the probe
        assert len(fake.received) == 1
        clock.advance(31)
        await drain(sender)  # the probe: 368 again, backoff doubles
        clock.advance(31)
        await drain(sender)
        assert len(fake.received) == 1
        await gauges.refresh_outbox(pool)
        assert (
            REGISTRY.get_sample_value(
                "gateway_breaker_state", {"scope": "number", "provider": "meta", "key": "1111"}
            )
            == 2
        )
        clock.advance(30)
        await drain(sender)  # the probe goes through: closed, and the rows it held are due
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
        await drain(sender)
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
        await drain(sender)
    finally:
        await sender.close()
    assert {r.phone_number_id: r.token for r in fake.received} == {
        "1111": "token-of-1111",
        "2222": "token-of-2222",
        "9999": "default-token",
    }


@pytest.mark.parametrize("dsn", [True, False], ids=["own connection", "pool connection"])
async def test_enqueue_wakes_the_sender_and_the_listener_reconnects(
    dsn: bool, settings: Settings, pool: asyncpg.Pool, fake: FakeProvider
) -> None:
    """With a 60 s poll, only NOTIFY can get a send out within seconds; after its LISTEN
    connection is killed the sender listens again. Without a DSN (the embedded database of a
    standalone `gateway send`) it listens on a connection held from its pool."""
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
            " WHERE query LIKE 'LISTEN %outbox%' AND pid <> pg_backend_pid()"
        )
        return n

    try:
        async with asyncio.timeout(10):
            while await listening() == 0:
                await asyncio.sleep(0.02)
        await sent(await enqueue(pool, "n1", "4915100000001"))
        await pool.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE 'LISTEN %outbox%'"
        )
        async with asyncio.timeout(10):
            while await listening() == 0:
                await asyncio.sleep(0.02)
        await sent(await enqueue(pool, "n2", "4915100000002"))
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
        await sender.close()
    assert len(fake.received) == 2


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
    await pool.execute("INSERT INTO webhook_inbox (source, body, state) VALUES ('meta', 'old', 'dead')")
    await enqueue(pool, "u1", TO)
    await enqueue(pool, "u2", "4915100000002")
    await pool.execute("UPDATE outbox SET state = 'review'")
    await pool.execute("INSERT INTO webhook_inbox (source, body) VALUES ('meta', 'new')")
    async with pool.acquire() as conn:
        with pytest.raises(ValueError, match="1 pending and 0 dead webhook"):
            await outbox.release(conn, "u1")
        bulk = await outbox.release_bulk(conn, state="review", since=None, until=None, tenant=None)
        assert (bulk.done, bulk.refused, bulk.waiting) == (0, 0, 2)
        await conn.execute("UPDATE webhook_inbox SET state = 'done' WHERE body = 'new'")
        assert "now pending" in await outbox.release(conn, "u1")  # the older dead row does not hold it
        bulk = await outbox.release_bulk(conn, state="review", since=None, until=None, tenant=None)
        assert (bulk.done, bulk.refused, bulk.waiting) == (1, 0, 0)


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
        await drain(sender)
        assert (fake.count(a), fake.count(b), fake.count(c)) == (1, 0, 1)
        clock.advance(11.9)
        await drain(sender)
        assert fake.count(b) == 0
        clock.advance(0.2)
        await drain(sender)
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
        await drain(sender)
        r = await row(pool, "t401")
        assert (r["state"], r["attempts"]) == ("pending", 0)
        b = await pool.fetchrow("SELECT * FROM send_breakers")
        assert (b["scope"], b["provider"], b["key"], b["state"]) == ("token", "tenashi", "default", "open")
        clock.advance(settings.breaker_backoff_s + 1)
        await drain(sender)  # the probe goes through
    finally:
        await sender.close()
    assert fake.count(cb) == 1
    assert (await row(pool, "t401"))["state"] == "accepted"
    assert await pool.fetchval("SELECT state FROM send_breakers") == "closed"


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
