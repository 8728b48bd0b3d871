"""Forwarding to downstream destinations against a real PostgreSQL and a really started fake
receiver that verifies each request with the ``standardwebhooks`` package. The tests marked
``citus`` also run on a Citus cluster (make test-citus): both formats, retries and replay, the
breaker, ordering, backfill, a dead forwarder's claim, the gauges; the others are the same code paths at
more cost there."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from datetime import timedelta

import asyncpg
import pytest
from aiohttp import ClientSession
from aiohttp.test_utils import TestServer

from gateway.core import stdwebhooks
from gateway.core.settings import Settings
from gateway.core.signature import sign_meta
from gateway.inbound.consumer import Consumer
from gateway.outbound.backfill import backfill
from gateway.outbound.wake import ForwarderWake
from gateway.runtime.services import SERVICES
from gateway.store import deliveries
from gateway.testing.fake_receiver import FakeReceiver, Scripted
from gateway.testing.payloads import (
    message_obj,
    messages_payload,
    meta_payload,
    meta_value,
    status_obj,
    tenashi_event,
    to_bytes,
)
from tests.support import deliveries as moved
from tests.support.citus_db import on_cluster
from tests.support.config import DESTINATION_SECRET, META_SECRET, public_metrics, replace
from tests.support.consume import drain, stage
from tests.support.forward import (
    add,
    all_delivered,
    fast,
    forwarding,
    order_per_customer,
    process_messages,
    process_status,
    started_receiver,
    states,
    until,
)


@pytest.mark.citus
async def test_fresh_events_get_one_delivery_per_matching_enabled_destination(
    pool: asyncpg.Pool, settings: Settings
) -> None:
    await add(pool, "crm", "http://127.0.0.1:9/a", ("message", "status"))
    await add(pool, "bot", "http://127.0.0.1:9/b", ("message",))
    await add(pool, "ops", "http://127.0.0.1:9/c", ("account",))
    await add(pool, "off", "http://127.0.0.1:9/d", ("message", "status", "account"))
    await deliveries.set_enabled(pool, name="off", enabled=False)
    body = to_bytes(
        meta_payload(
            ("messages", meta_value(messages=[message_obj("wamid.D1"), message_obj("wamid.D2")])),
            ("messages", meta_value(statuses=[status_obj("wamid.D0", "read")])),
            ("messages", meta_value(errors=[{"code": 131000}])),
        )
    )
    for _ in range(3):  # the first delivery and two webhook redeliveries
        await stage(pool, body)
        await drain(pool, settings)
    rows = await pool.fetch(
        "SELECT d.name, dl.event_key, dl.webhook_id, dl.kind, dl.conversation, dl.envelope, dl.state"
        " FROM deliveries dl JOIN destinations d ON d.id = dl.destination_id ORDER BY d.name, dl.id"
    )
    per: dict[str, list[str]] = defaultdict(list)
    for r in rows:
        per[r["name"]].append(r["kind"])
        # The SQL webhook id is the documented one.
        assert r["webhook_id"] == stdwebhooks.webhook_id(r["name"], r["event_key"])
        assert r["envelope"]["event_key"] == r["event_key"] and r["state"] == "pending"
    assert dict(per) == {
        "bot": ["message", "message"],
        "crm": ["message", "message", "status"],
        "ops": ["account"],
    }
    assert await pool.fetchval("SELECT count(*) FROM processed_webhook_events") == 4


async def test_forwarding_through_receiver_faults_delivers_every_event_verified(
    pool: asyncpg.Pool, settings: Settings
) -> None:
    # 25 % 5xx, 10 % "timeouts" (processed, answered after the forwarder gave up).
    r = FakeReceiver(DESTINATION_SECRET, p_5xx=0.25, p_timeout=0.1, timeout_s=0.6, seed=7)
    url = await r.start()
    try:
        await add(pool, "crm", url)
        keys = await process_messages(pool, settings, 60)
        await process_status(pool, settings, "wamid.F3", "delivered")
        s = fast(settings, forward_breaker_failures=1000)
        async with forwarding(pool, s):
            await until(lambda: all_delivered(pool), what="every delivery delivered")
        expected = {stdwebhooks.webhook_id("crm", k) for k in [*keys, "status:wamid.F3:delivered:"]}
        assert set(r.state.processed) == expected
        assert r.state.bad_signatures == 0
        assert r.state.answered[500] > 0 and len(r.state.duplicates) > 0  # the faults happened
        assert len(r.state.attempts) > len(expected)
        rows = await pool.fetch("SELECT attempts, last_status, delivered_at FROM deliveries")
        assert all(x["last_status"] == 204 and x["delivered_at"] for x in rows)
        assert sum(x["attempts"] for x in rows) == len(r.state.attempts)
        env = r.state.processed[stdwebhooks.webhook_id("crm", "msg:wamid.F0")]
        assert env["type"] == "message.received" and env["raw"]["text"] == {"body": "text 0"}
    finally:
        await r.close()


@pytest.mark.citus
async def test_breaker_opens_during_an_outage_and_drains_after(
    pool: asyncpg.Pool, settings: Settings, receiver: FakeReceiver
) -> None:
    await add(pool, "crm", receiver.url, max_in_flight=4)
    receiver.outage = True
    await process_messages(pool, settings, 30)
    s = fast(settings, forward_breaker_failures=3, forward_breaker_cooldown_s=0.4)

    async def breaker() -> str:
        return str(await pool.fetchval("SELECT breaker_state FROM destinations WHERE name = 'crm'"))

    async with forwarding(pool, s):
        await until(lambda: _is(breaker(), "open"), what="breaker open")
        # While open, only half-open probes (one at a time) reach the receiver.
        await asyncio.sleep(1.0)
        attempts_during_outage = len(receiver.state.attempts)
        assert attempts_during_outage < 3 + 4 + 6, attempts_during_outage
        assert receiver.state.max_in_flight <= 4
        receiver.outage = False
        await until(lambda: all_delivered(pool), what="backlog drained")
        assert await breaker() == "closed"
    assert len(receiver.state.processed) == 30
    assert receiver.state.bad_signatures == 0


async def _is(value: object, expected: str) -> bool:
    return await value == expected  # type: ignore[misc]


async def test_two_forwarders_never_post_one_delivery_concurrently(
    pool: asyncpg.Pool, settings: Settings, receiver: FakeReceiver
) -> None:
    await add(pool, "crm", receiver.url, max_in_flight=64)
    await process_messages(pool, settings, 150)
    async with forwarding(pool, fast(settings, forward_concurrency=8, forward_batch=5), n=2):
        await until(lambda: all_delivered(pool), what="every delivery delivered")
    # No faults: every id was posted exactly once, although two forwarders raced for them.
    assert len(receiver.state.attempts) == 150
    assert len(set(receiver.state.attempts)) == 150
    assert not receiver.state.duplicates


async def test_max_in_flight_holds_across_two_forwarders(pool: asyncpg.Pool, settings: Settings) -> None:
    # The destination's limit counts every forwarder's leases, not each forwarder's own.
    r = FakeReceiver(DESTINATION_SECRET, latency_ms=20)
    url = await r.start()
    try:
        await add(pool, "crm", url, max_in_flight=3)
        await process_messages(pool, settings, 40)
        async with forwarding(pool, fast(settings, forward_concurrency=8, forward_batch=8), n=2):
            await until(lambda: all_delivered(pool), what="every delivery delivered")
        assert r.state.max_in_flight == 3  # reached, never passed
        assert len(r.state.processed) == 40 and not r.state.duplicates
    finally:
        await r.close()


@pytest.mark.citus
async def test_max_in_flight_and_per_conversation_order(pool: asyncpg.Pool, settings: Settings) -> None:
    r = FakeReceiver(DESTINATION_SECRET, latency_ms=15, p_5xx=0.2, seed=3)
    url = await r.start()
    try:
        await add(pool, "bot", url, ("message",), max_in_flight=3, ordered=True)
        await process_messages(pool, settings, 40, customers=4)
        async with forwarding(pool, fast(settings, forward_breaker_failures=1000)):
            await until(lambda: all_delivered(pool), what="every delivery delivered")
        assert r.state.max_in_flight <= 3
        assert r.state.max_in_flight > 1  # customers do not wait for each other
        per_customer = order_per_customer(r)
        assert len(per_customer) == 4
        # The promise: each customer's messages in the order the gateway processed them (the
        # event ids), despite 5xx retries.
        processed = {
            int(k.removeprefix("msg:wamid.F")): i
            for k, i in await pool.fetch("SELECT event_key, id FROM delivery_events")
        }
        for seq in per_customer.values():
            assert [processed[n] for n in seq] == sorted(processed[n] for n in seq)
            # One consumer on one PostgreSQL processes them in the order they were staged; on a
            # cluster a consumer reads the lanes shard by shard, so webhooks staged in
            # different shards are processed in another order.
            assert on_cluster() or seq == sorted(seq)
    finally:
        await r.close()


async def test_retry_after_on_429_is_honoured(
    pool: asyncpg.Pool, settings: Settings, receiver: FakeReceiver
) -> None:
    await add(pool, "crm", receiver.url)
    receiver.script.append(Scripted(429, {"Retry-After": "30"}))
    await process_messages(pool, settings, 1)
    async with forwarding(pool, fast(settings)):
        await until(lambda: _attempted(pool), what="first attempt recorded")
    row = await pool.fetchrow(
        "SELECT state, last_status, next_attempt_at - clock_timestamp() AS wait FROM deliveries"
    )
    assert row is not None
    assert (row["state"], row["last_status"]) == ("pending", 429)
    assert row["wait"] > timedelta(seconds=25)  # not the 20 ms backoff


async def _attempted(pool: asyncpg.Pool) -> bool:
    return bool(await pool.fetchval("SELECT count(*) FROM deliveries WHERE last_status IS NOT NULL"))


@pytest.mark.citus
async def test_failed_after_the_retry_window_then_replayed_by_time_range(
    pool: asyncpg.Pool, settings: Settings, receiver: FakeReceiver
) -> None:
    await add(pool, "crm", receiver.url)
    keys = await process_messages(pool, settings, 9)
    # Three receipt-time slices: an hour ago, two hours ago, three hours ago.
    await moved.received(pool, "now() - make_interval(hours => 1 + ({id} % 3)::int)")
    receiver.outage = True
    async with forwarding(pool, fast(settings, forward_retry_h=0.0, forward_breaker_failures=1000)):
        await until(lambda: _states_are(pool, {"failed": 9}), what="every delivery failed")
    assert not receiver.state.processed
    now = await pool.fetchval("SELECT now()")
    since, until_ = now - timedelta(hours=2, minutes=30), now - timedelta(hours=1, minutes=30)
    listed = await deliveries.list_deliveries(
        pool, destination="crm", since=since, until=until_, state="failed", limit=100
    )
    assert len(listed) == 3
    receiver.outage = False
    async with pool.acquire() as conn:
        assert await deliveries.replay(
            conn, destination="crm", since=since, until=until_, state="failed"
        ) == (3, 0)
    async with forwarding(pool, fast(settings)):
        await until(lambda: _states_are(pool, {"failed": 6, "delivered": 3}), what="the slice delivered")
    assert set(receiver.state.processed) == {x.webhook_id for x in listed}
    assert set(receiver.state.processed) <= {stdwebhooks.webhook_id("crm", k) for k in keys}


async def _states_are(pool: asyncpg.Pool, expected: dict[str, int]) -> bool:
    return await states(pool) == expected


@pytest.mark.citus
async def test_backfill_a_new_destination_from_processed_events(
    pool: asyncpg.Pool, settings: Settings, receiver: FakeReceiver
) -> None:
    await add(pool, "early", receiver.url, ("message", "status", "account"))
    keys = await process_messages(pool, settings, 5)
    await process_status(pool, settings, "wamid.F1", "read")
    await stage(pool, to_bytes(meta_payload(("messages", meta_value(errors=[{"code": 131000}])))))
    tenashi = tenashi_event(
        "evt_77", "message.received", {"message_id": "tm77", "from": "49170", "type": "text"}
    )
    await stage(pool, to_bytes(tenashi), source="tenashi")
    await drain(pool, settings)
    live = {
        r["event_key"]: (r["envelope"], r["kind"], r["conversation"])
        for r in await pool.fetch("SELECT event_key, envelope, kind, conversation FROM deliveries")
    }
    assert len(live) == 8
    # A destination added later gets the same events, rebuilt from the tables.
    late_id = await add(pool, "late", receiver.url, ("message", "status", "account"))
    now = await pool.fetchval("SELECT now()")
    async with pool.acquire() as conn:
        b = await backfill(
            conn, destination="late", since=now - timedelta(hours=1), until=now + timedelta(hours=1)
        )
        assert (b.inserted, b.seen, b.skipped_no_key) == (8, 8, 0)
        again = await backfill(
            conn, destination="late", since=now - timedelta(hours=1), until=now + timedelta(hours=1)
        )
        assert again.inserted == 0
        empty = await backfill(
            conn, destination="late", since=now + timedelta(hours=1), until=now + timedelta(hours=2)
        )
        assert empty.seen == 0
    rows = await pool.fetch(
        "SELECT event_key, webhook_id, envelope, kind, conversation FROM deliveries"
        " WHERE destination_id = $1",
        late_id,
    )
    assert {r["event_key"] for r in rows} == set(live) >= set(keys) | {"evt:evt_77"}
    for r in rows:
        # The same body a live delivery would have carried.
        assert (r["envelope"], r["kind"], r["conversation"]) == live[r["event_key"]]
        assert r["webhook_id"] == stdwebhooks.webhook_id("late", r["event_key"])


@pytest.mark.citus
async def test_gateway_serve_forwards_a_meta_webhook_end_to_end(
    http: ClientSession, start_gateway: object, pool: asyncpg.Pool, settings: Settings, receiver: FakeReceiver
) -> None:
    await add(pool, "bot", receiver.url, ("message",))
    live = fast(public_metrics(settings), run_consumers=True, run_forwarder=True, consumer_poll_ms=50)
    server: TestServer = await start_gateway(live)  # type: ignore[operator]
    # Its consumers wake its forwarder after their commits (NOTIFY wakes other processes').
    app = server.app
    assert app is not None
    running = app[SERVICES]
    assert running.forwarder is not None and running.consumers is not None
    # (and on a Citus coordinator NOTIFY from their process: gateway.outbound.wake.ForwarderWake)
    wakes = [c._on_deliveries for c in running.consumers.consumers]
    fw = running.forwarder
    assert all(isinstance(w, ForwarderWake) and w._local == fw.kick and w.woken == fw.token for w in wakes)
    body = to_bytes(messages_payload(message_obj("wamid.E2E", "hello")))
    headers = {"Content-Type": "application/json", "X-Hub-Signature-256": sign_meta(body, META_SECRET)}
    for _ in range(2):  # Meta redelivers: still one delivery
        async with http.post(server.make_url("/webhooks/meta"), data=body, headers=headers) as resp:
            assert resp.status == 200
    assert await receiver.wait_for(1, 15)
    await until(lambda: all_delivered(pool), what="delivered")
    await asyncio.sleep(0.2)
    assert list(receiver.state.processed) == [stdwebhooks.webhook_id("bot", "msg:wamid.E2E")]
    assert len(receiver.state.attempts) == 1
    async with http.get(server.make_url("/metrics")) as resp:
        text = await resp.text()
    assert 'gateway_forward_deliveries_total{destination="bot",outcome="delivered"}' in text


async def test_disabled_and_removed_destinations(
    pool: asyncpg.Pool, settings: Settings, receiver: FakeReceiver
) -> None:
    await add(pool, "crm", receiver.url)
    await process_messages(pool, settings, 3)
    assert await deliveries.set_enabled(pool, name="crm", enabled=False)
    async with forwarding(pool, fast(settings)):
        await asyncio.sleep(0.4)
        assert not receiver.state.attempts  # pending deliveries wait while disabled
        assert await deliveries.set_enabled(pool, name="crm", enabled=True)
        await until(lambda: all_delivered(pool), what="delivered after enable")
    assert await deliveries.remove_destination(pool, name="crm") == 3
    assert await deliveries.remove_destination(pool, name="crm") is None
    assert await pool.fetchval("SELECT count(*) FROM deliveries") == 0
    with pytest.raises(asyncpg.CheckViolationError):
        await add(pool, "bad", receiver.url, secret="not-a-whsec")
    await add(pool, "dup", receiver.url)
    with pytest.raises(deliveries.DestinationExists):
        await add(pool, "dup", receiver.url)


@pytest.mark.citus
async def test_a_dead_forwarders_claim_is_taken_over_after_its_lease(
    pool: asyncpg.Pool, settings: Settings, receiver: FakeReceiver
) -> None:
    await add(pool, "crm", receiver.url)
    await process_messages(pool, settings, 2)
    # A forwarder claims both and dies before posting (its lease is short here). On a cluster a
    # round names lanes of one shard: one round per lane that holds a delivery.
    async with pool.acquire() as conn:
        rounds: list[list[int] | None] = [None]
        if on_cluster():
            rounds = [[r["lane"]] for r in await conn.fetch("SELECT DISTINCT lane FROM delivery_queue")]
        claimed: list[deliveries.Claimed] = []
        for lanes in rounds:
            got, _, _ = await deliveries.cycle(
                conn,
                forwarder="dead",
                results=[],
                breakers=[],
                threshold=5,
                limit=10,
                lease_s=0.3,
                cooldown_s=30,
                housekeeping=True,
                held=[c.ref for c in claimed],
                lanes=lanes,
            )
            claimed += got
    assert len(claimed) == 2 and await states(pool) == {"delivering": 2}
    async with forwarding(pool, fast(settings)):
        await until(lambda: all_delivered(pool), what="taken over and delivered")
    # An attempt is counted with its outcome: the dead forwarder's never had one.
    assert sorted(await pool.fetchval("SELECT array_agg(attempts) FROM deliveries")) == [1, 1]
    assert len(receiver.state.processed) == 2


async def test_unreachable_redirecting_and_refusing_destinations_are_retried_not_followed(
    pool: asyncpg.Pool, settings: Settings, receiver: FakeReceiver
) -> None:
    await add(pool, "gone", "http://127.0.0.1:9/nothing-listens-here", ("message",))
    await add(pool, "moved", receiver.url, ("message",))
    receiver.script.append(Scripted(302, {"Location": receiver.url + "/elsewhere"}))
    await process_messages(pool, settings, 1)
    async with forwarding(pool, fast(settings, forward_retry_base_ms=5000, forward_retry_max_ms=5000)):
        await until(lambda: _attempted_both(pool), what="both attempted")
    rows = {
        r["name"]: r
        for r in await pool.fetch(
            "SELECT d.name, dl.state, dl.last_status, dl.last_error, dl.attempts"
            " FROM deliveries dl JOIN destinations d ON d.id = dl.destination_id"
        )
    }
    assert rows["moved"]["state"] == "pending" and rows["moved"]["last_status"] == 302
    assert rows["gone"]["state"] == "pending" and rows["gone"]["last_status"] is None
    assert "Connect" in rows["gone"]["last_error"]
    assert receiver.state.attempts == [stdwebhooks.webhook_id("moved", "msg:wamid.F0")]  # no redirect hop


async def _attempted_both(pool: asyncpg.Pool) -> bool:
    return bool(
        await pool.fetchval("SELECT count(*) = 2 FROM deliveries WHERE attempts > 0 AND state = 'pending'")
    )


async def test_retention_purges_old_delivered_deliveries_and_keeps_failed_ones(
    pool: asyncpg.Pool, settings: Settings
) -> None:
    from gateway.maintenance import retention

    dest = await add(pool, "crm", "http://127.0.0.1:9/h")
    now = await pool.fetchval("SELECT now()")
    for i in range(12):  # every third failed, the rest delivered; every second one 40 days old
        state = "failed" if i % 3 == 0 else "delivered"
        at = now - timedelta(days=40 if i % 2 == 0 else 1)
        await moved.made_up(pool, destination_id=dest, key=f"msg:wamid.R{i}", state=state, received_at=at)
    expected_left = await pool.fetchval(
        "SELECT count(*) FROM deliveries WHERE state = 'failed' OR received_at > now() - interval '30 days'"
    )
    report = await retention.run_once(pool, replace(settings, purge_batch=2, delivery_retention_days=30))
    old = (now - timedelta(days=40)).date()
    assert {f"delivery_log_p{old:%Y%m%d}", f"delivery_events_p{old:%Y%m%d}"} <= set(report.dropped)
    assert report.carried_events == 2  # the old failed ones' bodies, kept for a replay
    assert await pool.fetchval("SELECT count(*) FROM deliveries") == expected_left == 12 - 4
    assert await pool.fetchval("SELECT count(*) FROM deliveries WHERE state = 'failed'") == 4


@pytest.mark.citus
async def test_gauges_per_destination(pool: asyncpg.Pool, settings: Settings, receiver: FakeReceiver) -> None:
    from prometheus_client import REGISTRY

    from gateway.maintenance import gauges

    await add(pool, "gauged", receiver.url)
    await process_messages(pool, settings, 4)
    await moved.received(pool, "now() - interval '90 seconds'")
    await pool.execute("UPDATE destinations SET breaker_state = 'open' WHERE name = 'gauged'")
    await gauges.refresh_forward(pool)
    labels = {"destination": "gauged"}
    assert REGISTRY.get_sample_value("gateway_forward_backlog", labels) == 4
    assert REGISTRY.get_sample_value("gateway_forward_oldest_due_seconds", labels) >= 90
    assert REGISTRY.get_sample_value("gateway_forward_breaker_state", labels) == 2
    # Bounded work whatever the backlog: counted up to the cap, a backlog at it reads "at least".
    (capped,) = await deliveries.gauges(pool, cap=3)
    assert (capped.backlog, capped.oldest_due_s >= 90) == (3, True)
    await deliveries.remove_destination(pool, name="gauged")
    await gauges.refresh_forward(pool)
    assert REGISTRY.get_sample_value("gateway_forward_backlog", labels) is None


async def test_an_open_breaker_is_not_closed_by_requests_sent_before_it_opened(
    pool: asyncpg.Pool, settings: Settings
) -> None:
    """Successes of requests already in flight when the breaker opened (another forwarder's
    failures opened it, say) leave it open: only its half-open probe closes it."""
    slow = await started_receiver(latency_ms=300)
    try:
        await add(pool, "crm", slow.url, max_in_flight=4)
        await process_messages(pool, settings, 4)
        # A timeout far above the receiver's latency: a request that timed out on a busy machine
        # would wait out the open breaker's cool-down instead of being answered.
        busy_proof = fast(settings, forward_breaker_cooldown_s=600, forward_timeout_ms=10_000)
        async with forwarding(pool, busy_proof):
            await until(lambda: _posted(slow, 4), what="four requests in flight")
            await pool.execute("UPDATE destinations SET breaker_state = 'open', breaker_changed_at = now()")
            await until(lambda: all_delivered(pool), what="the four answered")
        assert await pool.fetchval("SELECT breaker_state FROM destinations") == "open"
        assert len(slow.state.processed) == 4
    finally:
        await slow.close()


async def _posted(receiver: FakeReceiver, n: int) -> bool:
    return len(receiver.state.attempts) >= n


async def test_a_consumer_wakes_an_in_process_forwarder_after_committing_deliveries(
    pool: asyncpg.Pool, settings: Settings
) -> None:
    # gateway serve wires this to its forwarder's wake-up: no wait for the NOTIFY to come back
    # through PostgreSQL. Only a batch that inserted deliveries calls it, after its COMMIT.
    await add(pool, "bot", "http://127.0.0.1:9/b", ("message",))
    calls: list[int] = []

    def woken() -> None:
        calls.append(1)

    consumer = Consumer(pool, settings, on_deliveries=woken)
    message = to_bytes(messages_payload(message_obj("wamid.W1")))
    await stage(pool, message)
    assert await consumer.process_batch() == 1
    assert calls == [1]
    assert await pool.fetchval("SELECT count(*) FROM deliveries") == 1  # committed
    await stage(pool, message)  # a redelivery: nothing fresh, no delivery
    statuses = meta_payload(("messages", meta_value(statuses=[status_obj("wamid.W0", "read")])))
    await stage(pool, to_bytes(statuses))  # a status: no destination wants it
    assert await consumer.process_batch() == 2
    assert calls == [1]
