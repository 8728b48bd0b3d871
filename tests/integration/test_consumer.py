"""Exactly-once processing against a real PostgreSQL (and the real HTTP gateway where it matters)."""

from __future__ import annotations

import asyncio
import time

import asyncpg
import orjson
import pytest
from aiohttp import ClientSession
from aiohttp.test_utils import TestServer
from prometheus_client import REGISTRY

from gateway.core.faults import ConsumerHealth
from gateway.core.planning import StagedRow, plan_batch
from gateway.core.settings import Settings
from gateway.core.signature import sign_tenashi
from gateway.inbound import applier as applier_module
from gateway.inbound import consumer as consumer_module
from gateway.inbound import retries as retries_module
from gateway.inbound.consumer import Consumer
from gateway.store import deliveries, inbox
from gateway.testing.payloads import (
    message_obj,
    messages_payload,
    meta_payload,
    meta_value,
    status_obj,
    statuses_payload,
    tenashi_event,
    to_bytes,
)
from tests.support.citus_db import on_cluster
from tests.support.config import DESTINATION_SECRET, TENASHI_SECRET, replace
from tests.support.consume import add_outbox, counts, drain, inbox_states, outbox_row, stage
from tests.support.http import post_meta
from tests.support.procs import gateway_ok

# Also run on a Citus cluster (make test-citus): exactly once, side effects, poison, replay.
pytestmark = pytest.mark.citus

ERR = [{"code": 131026, "title": "Message undeliverable"}]


async def wait_until_drained(pool: asyncpg.Pool, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while await pool.fetchval("SELECT count(*) FROM inbox_unread()"):
        assert time.monotonic() < deadline, "consumers did not drain the inbox"
        await asyncio.sleep(0.02)


async def test_same_payload_five_times_in_sequence_one_side_effect(
    http: ClientSession, gateway: TestServer, pool: asyncpg.Pool, settings: Settings
) -> None:
    await add_outbox(pool, "cb-seq")
    body = to_bytes(
        meta_payload(
            ("messages", meta_value(messages=[message_obj("wamid.SEQ")])),
            ("messages", meta_value(statuses=[status_obj("wamid.OUT", "delivered", callback="cb-seq")])),
        )
    )
    for _ in range(5):
        assert (await post_meta(http, gateway, body))[0] == 200
        await drain(pool, settings)
    assert await counts(pool) == {
        "processed_webhook_events": 2,
        "inbound_messages": 1,
        "message_statuses": 1,
        "account_errors": 0,
        "account_updates": 0,
    }
    assert await inbox_states(pool) == {"done": 5}
    row = await outbox_row(pool, "cb-seq")
    assert (row["state"], row["wamid"], row["delivery_status"]) == ("accepted", "wamid.OUT", "delivered")


async def test_same_payload_five_times_concurrently_with_live_consumers(
    http: ClientSession, start_gateway: object, pool: asyncpg.Pool, settings: Settings
) -> None:
    # The gateway runs its own consumers (woken by NOTIFY), one row per batch, three at once,
    # so the five copies are handled in concurrent transactions.
    live = replace(
        settings, run_consumers=True, consumer_concurrency=3, consumer_batch=1, consumer_poll_ms=5000
    )
    server = await start_gateway(live)  # type: ignore[operator]
    await add_outbox(pool, "cb-conc")
    body = to_bytes(
        meta_payload(
            ("messages", meta_value(messages=[message_obj("wamid.CONC")])),
            ("messages", meta_value(statuses=[status_obj("wamid.OUT2", "read", callback="cb-conc")])),
        )
    )
    statuses = [s for s, _ in await asyncio.gather(*(post_meta(http, server, body) for _ in range(5)))]
    assert statuses == [200] * 5
    await wait_until_drained(pool)
    c = await counts(pool)
    assert (c["processed_webhook_events"], c["inbound_messages"], c["message_statuses"]) == (2, 1, 1)
    assert await inbox_states(pool) == {"done": 5}
    assert (await outbox_row(pool, "cb-conc"))["delivery_status"] == "read"


async def test_concurrent_consumers_on_direct_copies(pool: asyncpg.Pool, settings: Settings) -> None:
    body = to_bytes(messages_payload(message_obj("wamid.DIRECT")))
    for _ in range(5):
        await stage(pool, body)
    await drain(pool, replace(settings, consumer_batch=1), consumers=5)
    c = await counts(pool)
    assert (c["processed_webhook_events"], c["inbound_messages"]) == (1, 1)
    assert await inbox_states(pool) == {"done": 5}


@pytest.mark.skipif(on_cluster(), reason="the shard numbers are made up here; a cluster's are its shards'")
@pytest.mark.parametrize(
    ("batch", "batch_bytes", "enough", "first"),
    [(100, 1 << 20, 50, 12), (12, 1 << 20, 50, 4), (100, 1, 50, 1), (100, 1 << 20, 3, 4)],
)
async def test_a_step_reads_several_shards_within_one_batchs_limits(
    pool: asyncpg.Pool,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
    batch: int,
    batch_bytes: int,
    enough: int,
    first: int,
) -> None:
    # The lanes numbered into 8 shards as on a cluster (inbox_lanes.shard), one webhook in each
    # of 12 lanes (shards 0-3 hold two, lanes n and n + 8): a step reads shard after shard into
    # one batch until no shard is left (12 rows), or it holds a quarter of its row limit (shards
    # 0 and 1: 4 rows), or ENOUGH_ROWS however large the limit (3: shards 0 and 1 again), or its
    # byte budget is used up (the first row of a read always comes), and leaves the rest for
    # the next.
    monkeypatch.setattr(consumer_module, "ENOUGH_ROWS", enough)
    await pool.execute("UPDATE inbox_lanes SET shard = lane % 8")
    for lane in range(12):
        body = to_bytes(messages_payload(message_obj(f"wamid.SH{lane}")))
        await inbox.insert_batch(pool, sources=["meta"], bodies=[body], delivery_ids=[None], lane=lane)
    consumer = Consumer(pool, replace(settings, consumer_batch=batch, consumer_batch_bytes=batch_bytes))
    steps = [await consumer.process_batch()]
    while steps[-1]:
        steps.append(await consumer.process_batch())
    assert steps[0] == first and sum(steps) == 12, steps
    c = await counts(pool)
    assert (c["processed_webhook_events"], c["inbound_messages"]) == (12, 12)


@pytest.mark.skipif(
    on_cluster(),
    reason="Citus: a batch reads the lanes of a few shards (a statement each, on its worker), so "
    "the staged set is not one batch there; exactly once"
    " over many batches is test_load's and the others' here",
)
async def test_1000_statuses_and_100_messages_every_key_once(pool: asyncpg.Pool, settings: Settings) -> None:
    for i in range(100):
        await add_outbox(pool, f"cb-{i}")
    payloads = []
    for i in range(100):
        sts = [status_obj(f"wamid.O{i}", s, callback=f"cb-{i}") for s in ("sent", "delivered", "read")]
        sts += [status_obj(f"wamid.U{i}", "read", participant=f"p{j}") for j in range(7)]
        payloads.append(
            meta_payload(("messages", meta_value(messages=[message_obj(f"wamid.M{i}")], statuses=sts)))
        )
    # Every payload staged once, a fifth of them again (redeliveries), in one big batch.
    for p in payloads + payloads[::5]:
        await stage(pool, to_bytes(p))
    consumer = Consumer(pool, replace(settings, consumer_batch=1000))
    assert await consumer.process_batch() == 120
    assert await consumer.process_batch() == 0
    assert await counts(pool) == {
        "processed_webhook_events": 1100,
        "inbound_messages": 100,
        "message_statuses": 1000,
        "account_errors": 0,
        "account_updates": 0,
    }
    dupes = await pool.fetchval("SELECT count(*) - count(DISTINCT event_key) FROM message_statuses")
    assert dupes == 0
    states = await pool.fetch("SELECT state, delivery_status, count(*) FROM outbox GROUP BY 1, 2")
    assert [tuple(r) for r in states] == [("accepted", "read", 100)]


async def test_group_status_with_three_participants_three_keys(
    pool: asyncpg.Pool, settings: Settings
) -> None:
    await add_outbox(pool, "cb-group")
    st = status_obj("wamid.GRP", "delivered", callback="cb-group", participant=["p1", "p2", "p3"])
    await stage(pool, to_bytes(statuses_payload(st)))
    await drain(pool, settings)
    keys = [r[0] for r in await pool.fetch("SELECT event_key FROM processed_webhook_events ORDER BY 1")]
    assert keys == [f"status:wamid.GRP:delivered:{p}" for p in ("p1", "p2", "p3")]
    rows = await pool.fetch("SELECT participant FROM message_statuses ORDER BY participant")
    assert [r[0] for r in rows] == ["p1", "p2", "p3"]
    assert (await outbox_row(pool, "cb-group"))["delivery_status"] == "delivered"


@pytest.mark.parametrize(
    ("arrivals", "final"),
    [
        (["read", "delivered", "sent"], "read"),
        (["read", "sent"], "read"),
        (["sent", "read", "delivered"], "read"),
        (["delivered", "sent"], "delivered"),
        (["sent", "failed", "delivered"], "failed"),
        (["read", "played"], "played"),
        (["sent", "deleted", "sent"], "sent"),
    ],
)
@pytest.mark.parametrize("one_batch", [False, True])
async def test_statuses_out_of_order_only_move_forward(
    pool: asyncpg.Pool, settings: Settings, arrivals: list[str], final: str, one_batch: bool
) -> None:
    await add_outbox(pool, "cb-ooo")
    for status in arrivals:
        errors = ERR if status == "failed" else None
        await stage(
            pool,
            to_bytes(statuses_payload(status_obj("wamid.OOO", status, callback="cb-ooo", errors=errors))),
        )
        if not one_batch:
            await drain(pool, settings)
    await drain(pool, settings)
    row = await outbox_row(pool, "cb-ooo")
    assert (row["state"], row["wamid"], row["delivery_status"]) == ("accepted", "wamid.OOO", final)
    assert row["delivery_errors"] == (ERR if final == "failed" else None)
    assert await pool.fetchval("SELECT count(*) FROM message_statuses") == len(set(arrivals))


async def test_a_report_that_changes_nothing_leaves_the_send_untouched(
    pool: asyncpg.Pool, settings: Settings
) -> None:
    # A report no further than the send's (Meta's arrive out of order) neither updates nor
    # locks the outbox row: its version (xmin) and its last locker (xmax) stay as they were.
    await add_outbox(pool, "cb-noop", state="accepted", wamid="wamid.NOOP")
    await stage(pool, to_bytes(statuses_payload(status_obj("wamid.NOOP", "read", callback="cb-noop"))))
    await drain(pool, settings)
    version = (
        "SELECT xmin::text AS xmin, xmax::text AS xmax, delivery_status FROM outbox WHERE callback_data = $1"
    )
    before = await pool.fetchrow(version, "cb-noop")
    assert before is not None and before["delivery_status"] == "read"
    for status in ("delivered", "sent", "read"):
        await stage(pool, to_bytes(statuses_payload(status_obj("wamid.NOOP", status, callback="cb-noop"))))
    await drain(pool, settings)
    assert await pool.fetchrow(version, "cb-noop") == before
    assert await pool.fetchval("SELECT count(*) FROM message_statuses") == 3
    # A report that is further still moves it.
    await stage(pool, to_bytes(statuses_payload(status_obj("wamid.NOOP", "played", callback="cb-noop"))))
    await drain(pool, settings)
    after = await pool.fetchrow(version, "cb-noop")
    assert after is not None and after["delivery_status"] == "played" and after["xmin"] != before["xmin"]


@pytest.mark.parametrize(
    ("state", "resent", "after"),
    [
        ("sending", False, "accepted"),
        ("unknown", False, "accepted"),
        ("review", False, "accepted"),
        ("pending", True, "accepted"),
        ("accepted", False, "accepted"),
        ("failed", False, "failed"),
        ("cancelled", False, "cancelled"),
    ],
)
async def test_status_moves_outbox_state(
    pool: asyncpg.Pool, settings: Settings, state: str, resent: bool, after: str
) -> None:
    await add_outbox(pool, "cb-state", state=state, resent=resent)
    await stage(pool, to_bytes(statuses_payload(status_obj("wamid.ST", "sent", callback="cb-state"))))
    await drain(pool, settings)
    row = await outbox_row(pool, "cb-state")
    assert (row["state"], row["delivery_status"]) == (after, "sent")
    assert (row["accepted_at"] is not None) == (after == "accepted" and state != "accepted")


async def test_a_delivery_report_alone_leaves_the_sends_updated_at(
    pool: asyncpg.Pool, settings: Settings
) -> None:
    # updated_at is when the send's own state last changed (retention and the review list go
    # by it); delivery reports move delivery_status only, and a report that proves an unsure
    # send accepted moves both.
    await add_outbox(pool, "cb-rep", state="accepted", wamid="wamid.REP")
    await add_outbox(pool, "cb-unsure", state="unknown")
    when = "SELECT updated_at FROM outbox WHERE callback_data = $1"
    before = {cb: await pool.fetchval(when, cb) for cb in ("cb-rep", "cb-unsure")}
    for status in ("sent", "delivered", "read"):
        await stage(pool, to_bytes(statuses_payload(status_obj("wamid.REP", status, callback="cb-rep"))))
        await drain(pool, settings)
        assert (await outbox_row(pool, "cb-rep"))["delivery_status"] == status
        assert await pool.fetchval(when, "cb-rep") == before["cb-rep"]
    await stage(pool, to_bytes(statuses_payload(status_obj("wamid.UNS", "delivered", callback="cb-unsure"))))
    await drain(pool, settings)
    row = await outbox_row(pool, "cb-unsure")
    assert (row["state"], row["wamid"], row["delivery_status"]) == ("accepted", "wamid.UNS", "delivered")
    assert await pool.fetchval(when, "cb-unsure") > before["cb-unsure"]


@pytest.mark.skipif(
    on_cluster(), reason="the outbox's shard is written on a worker, whose counters these are not"
)
async def test_a_delivery_report_is_written_without_touching_the_outboxs_indexes(pool: asyncpg.Pool) -> None:
    # A report changes no indexed column of an accepted send, so PostgreSQL writes it heap-only
    # (no new entry in any of outbox's indexes): an index on a column the report changes would
    # make every status of every send re-index its row, and this fails.
    await add_outbox(pool, "cb-hot", state="accepted", wamid="wamid.HOT")
    await add_outbox(pool, "cb-cold", state="sending")
    reports = [
        StagedRow(
            1, "meta", to_bytes(statuses_payload(status_obj("wamid.HOT", "read", callback="cb-hot"))), None
        ),
        StagedRow(
            2, "meta", to_bytes(statuses_payload(status_obj("wamid.CLD", "sent", callback="cb-cold"))), None
        ),
    ]
    # The view also counts the backend's earlier transactions not yet flushed: differences only.
    counted = "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_xact_user_tables WHERE relname = 'outbox'"
    async with pool.acquire() as conn, conn.transaction():

        async def applied(rows: list[StagedRow]) -> tuple[int, int]:
            upd, hot = await conn.fetchrow(counted)
            await inbox.apply_plan(conn, plan_batch(rows))
            upd2, hot2 = await conn.fetchrow(counted)
            return upd2 - upd, hot2 - hot

        assert await applied(reports[:1]) == (1, 1)
        # A report that changes the send's state (sending -> accepted, its wamid learnt) is not.
        assert await applied(reports[1:]) == (1, 0)


async def test_a_batch_planned_without_forwards_is_applied_again_with_them_once_a_destination_is_enabled(
    pool: asyncpg.Pool, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A consumer builds no forwards while no destination takes events; the first batch after
    one is enabled is refused (SQLSTATE GWF01) and applied again with them in its transaction,
    and batches carry them from the start for FORWARDING_S after: every event is queued once."""

    def redone() -> float:
        return REGISTRY.get_sample_value("gateway_consumer_forwards_redone_total") or 0.0

    async def consume(c: Consumer, wamid: str) -> None:
        await stage(pool, to_bytes(messages_payload(message_obj(wamid, sender="4915100000077"))))
        while await c.step():
            pass

    async def queued() -> list[str]:
        # Each event queued once (events are appended only for destinations that want them).
        assert await pool.fetchval("SELECT count(*) FROM delivery_queue") == await pool.fetchval(
            "SELECT count(*) FROM delivery_events"
        )
        return [r[0] for r in await pool.fetch("SELECT event_key FROM delivery_events ORDER BY 1")]

    c = Consumer(pool, settings)
    before = redone()
    await consume(c, "wamid.WH0")
    assert redone() == before and await queued() == []
    crm = await deliveries.add_destination(
        pool, name="crm", url="http://127.0.0.1:9/x", events=["message"], secret=DESTINATION_SECRET,
        max_in_flight=4, ordered=False,
    )  # fmt: skip
    await consume(c, "wamid.WH1")
    await consume(c, "wamid.WH2")
    assert redone() == before + 1
    assert await queued() == ["msg:wamid.WH1", "msg:wamid.WH2"]
    # Enabled destinations that want none of the events: each batch past the window is
    # refused once, and nothing is queued.
    monkeypatch.setattr(applier_module, "FORWARDING_S", 0.0)
    await pool.execute("UPDATE destinations SET enabled = false WHERE id = $1", crm)
    await deliveries.add_destination(
        pool, name="sts", url="http://127.0.0.1:9/y", events=["status"], secret=DESTINATION_SECRET,
        max_in_flight=4, ordered=False,
    )  # fmt: skip
    c = Consumer(pool, settings)
    await consume(c, "wamid.WH3")
    await consume(c, "wamid.WH4")
    assert redone() == before + 3
    assert await queued() == ["msg:wamid.WH1", "msg:wamid.WH2"]
    assert await pool.fetchval("SELECT count(*) FROM inbound_messages") == 5
    assert await pool.fetchval("SELECT count(*) FROM processed_webhook_events") == 5


async def test_status_without_callback_matches_by_wamid(pool: asyncpg.Pool, settings: Settings) -> None:
    await add_outbox(pool, "cb-w", state="accepted", wamid="wamid.KNOWN")
    await stage(pool, to_bytes(statuses_payload(status_obj("wamid.KNOWN", "delivered"))))
    await drain(pool, settings)
    assert (await outbox_row(pool, "cb-w"))["delivery_status"] == "delivered"


async def test_status_for_unknown_key_is_recorded_not_an_error(
    pool: asyncpg.Pool, settings: Settings
) -> None:
    await stage(pool, to_bytes(statuses_payload(status_obj("wamid.NOPE", "read", callback="cb-nobody"))))
    await drain(pool, settings)
    assert await inbox_states(pool) == {"done": 1}
    row = await pool.fetchrow("SELECT wamid, status, callback_data FROM message_statuses")
    assert tuple(row) == ("wamid.NOPE", "read", "cb-nobody")


async def test_account_errors_and_other_fields_recorded_once(pool: asyncpg.Pool, settings: Settings) -> None:
    payload = meta_payload(
        ("messages", meta_value(errors=[{"code": 131000, "title": "Something went wrong"}])),
        ("message_template_status_update", {"event": "APPROVED", "message_template_id": 7}),
    )
    for _ in range(3):
        await stage(pool, to_bytes(payload))
    await drain(pool, settings)
    c = await counts(pool)
    assert (c["account_errors"], c["account_updates"], c["processed_webhook_events"]) == (1, 1, 2)
    row = await pool.fetchrow("SELECT waba_id, phone_number_id, errors FROM account_errors")
    assert tuple(row) == ("waba-0", "1111", [{"code": 131000, "title": "Something went wrong"}])


async def test_tenashi_events_through_the_gateway(
    http: ClientSession, gateway: TestServer, pool: asyncpg.Pool, settings: Settings
) -> None:
    await add_outbox(pool, "idem-t1")
    events = [
        tenashi_event(
            "evt_a",
            "message.status",
            {"message_id": "tm1", "status": "delivered", "idempotency_key": "idem-t1"},
        ),
        tenashi_event(
            "evt_b",
            "message.received",
            {"message_id": "tm2", "from": "4917", "type": "text", "text": {"body": "x"}},
        ),
    ]
    for ev in events + events:
        body = to_bytes(ev)
        headers = {
            "X-Tenashi-Signature": sign_tenashi(body, TENASHI_SECRET),
            "X-Tenashi-Delivery": str(ev["id"]),
        }
        async with http.post(gateway.make_url("/webhooks/tenashi"), data=body, headers=headers) as r:
            assert r.status == 200
    await drain(pool, settings)
    c = await counts(pool)
    assert (c["processed_webhook_events"], c["inbound_messages"], c["message_statuses"]) == (2, 1, 1)
    row = await outbox_row(pool, "idem-t1")
    assert (row["state"], row["wamid"], row["delivery_status"]) == ("accepted", "tm1", "delivered")
    assert await pool.fetchval("SELECT source FROM inbound_messages") == "tenashi"


@pytest.mark.skipif(
    on_cluster(),
    reason="Citus: the inbound_messages NOTIFY trigger is dropped on a cluster (it would run on a "
    "worker inside a two-phase commit); the feed polls there",
)
async def test_inbound_messages_notify_and_reply_claim(
    pool: asyncpg.Pool, settings: Settings, db_dsn: str
) -> None:
    listener = await asyncpg.connect(db_dsn)
    got: asyncio.Queue[str] = asyncio.Queue()
    await listener.add_listener("inbound_messages", lambda *a: got.put_nowait(a[3]))
    try:
        await stage(pool, to_bytes(messages_payload(message_obj("wamid.N1"), message_obj("wamid.N2"))))
        await drain(pool, settings)
        top = await asyncio.wait_for(got.get(), 5)
        assert int(top) == await pool.fetchval("SELECT max(id) FROM inbound_messages")
        assert got.empty()  # one NOTIFY per batch, not per message
    finally:
        await listener.close()
    # One reply per message, whatever the bot: the first claim only.
    claims = [
        await pool.fetchval("SELECT claim_reply($1, $2)", "wamid.N1", bot)
        for bot in ("bot-a", "bot-a", "bot-b", "bot-b")
    ]
    assert claims == [True, False, False, False]
    assert await pool.fetchval(
        "SELECT array_agg(claimed_by ORDER BY claimed_by) FROM reply_claims WHERE inbound_wamid = 'wamid.N1'"
    ) == ["bot-a"]


# Citus refuses triggers created on distributed tables after they are distributed.
needs_trigger = pytest.mark.skipif(
    on_cluster(), reason="Citus: the poison is injected by a trigger, created after distribution"
)
POISON_TRIGGER = """
CREATE FUNCTION reject_poison() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.wamid = 'wamid.POISON' THEN RAISE EXCEPTION 'downstream rejects %', NEW.wamid; END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER reject_poison BEFORE INSERT ON inbound_messages
    FOR EACH ROW EXECUTE FUNCTION reject_poison();
"""


@needs_trigger
async def test_poisoned_event_parked_rest_commits_then_replayed_once(
    pool: asyncpg.Pool, settings: Settings, db_dsn: str
) -> None:
    await pool.execute(POISON_TRIGGER)
    s = replace(settings, max_attempts=2, retry_base_ms=1, retry_max_ms=5, consumer_batch=50)
    ids = [await stage(pool, to_bytes(messages_payload(message_obj(f"wamid.OK{i}")))) for i in range(5)]
    poison_id = await stage(pool, to_bytes(messages_payload(message_obj("wamid.POISON"))))
    ids += [await stage(pool, to_bytes(messages_payload(message_obj(f"wamid.OK{i}")))) for i in range(5, 10)]

    consumer = Consumer(pool, s, health=ConsumerHealth(time.monotonic))
    assert await consumer.process_batch() == 11
    # The rest of the batch committed, every row is done; the poisoned event is a dead item
    # due again after a backoff, its first attempt counted (the other messages went through).
    assert await pool.fetchval("SELECT count(*) FROM inbound_messages") == 10
    assert await inbox_states(pool) == {"done": 11}
    item = await pool.fetchrow("SELECT * FROM dead_events")
    assert (item["inbox_id"], item["event_key"], item["state"], item["attempts"]) == (
        poison_id,
        "msg:wamid.POISON",
        "retry",
        1,
    )
    assert "downstream rejects wamid.POISON" in item["last_error"]
    assert item["path"] == "/entry/0/changes/0/value/messages/0"
    assert orjson.loads(bytes(item["fragment"])) == message_obj("wamid.POISON")
    # More traffic goes through meanwhile, so the next failure is the event's own again.
    await stage(pool, to_bytes(messages_payload(message_obj("wamid.OK10"))))
    await asyncio.sleep(0.02)
    await drain(pool, s)
    item = await pool.fetchrow("SELECT state, attempts FROM dead_events")
    assert (item["state"], item["attempts"]) == ("dead", 2)
    assert await pool.fetchval("SELECT count(*) FROM processed_webhook_events") == 11

    # The operator lists it, fixes the cause, and replays it through the CLI.
    out = await gateway_ok(db_dsn, "dead", "list")
    assert (
        f"row=R{poison_id}" in out and "downstream rejects" in out and "0 dead row(s), 1 dead event(s)" in out
    )
    item_id = await pool.fetchval("SELECT id FROM dead_events")
    out = await gateway_ok(db_dsn, "dead", "show", f"E{item_id}")
    assert "error: RaiseError: downstream rejects wamid.POISON" in out
    assert '"id":"wamid.POISON"' in out
    await pool.execute("DROP TRIGGER reject_poison ON inbound_messages")
    out = await gateway_ok(db_dsn, "dead", "replay", f"E{item_id}")
    assert f"replayed 1 event(s): [{item_id}]" in out
    await drain(pool, s)
    assert await pool.fetchval("SELECT count(*) FROM inbound_messages WHERE wamid = 'wamid.POISON'") == 1
    assert await pool.fetchval("SELECT state FROM dead_events") == "done"
    # Replaying a processed event again (an operator mistake) does nothing more.
    await pool.execute("UPDATE dead_events SET state = 'dead'")
    out = await gateway_ok(db_dsn, "dead", "replay", "--all")
    assert f"replayed 1 event(s): [{item_id}]" in out
    await drain(pool, s)
    assert await pool.fetchval("SELECT count(*) FROM inbound_messages") == 12
    assert await pool.fetchval("SELECT count(*) FROM processed_webhook_events") == 12
    # A whole row replayed: its events are duplicates by their keys.
    await pool.execute(
        "INSERT INTO inbox_parked (inbox_id, received_at, source, delivery_id, body, state, attempts)"
        " SELECT id, received_at, source, delivery_id, body, 'dead', 1 FROM webhook_inbox WHERE id = $1",
        poison_id,
    )
    conn = await asyncpg.connect(db_dsn)
    try:
        assert await inbox.dead_replay(conn, ids=None) == [poison_id]
    finally:
        await conn.close()
    await drain(pool, s)
    assert await pool.fetchval("SELECT count(*) FROM inbound_messages") == 12


async def test_a_retry_claims_at_most_retry_claim_webhooks_moved_aside(
    pool: asyncpg.Pool, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The retries' claim is RETRY_CLAIM (lowered here to 2) even when the batch is larger (10):
    # three webhooks due again are claimed as 2 then 1, and each comes back done once.
    monkeypatch.setattr(retries_module, "RETRY_CLAIM", 2)
    s = replace(settings, consumer_batch=10)
    ids = [await stage(pool, to_bytes(messages_payload(message_obj(f"wamid.RC{i}")))) for i in range(3)]
    await drain(pool, s)
    await pool.execute(
        "INSERT INTO inbox_parked (inbox_id, received_at, source, delivery_id, body, state, attempts,"
        " next_attempt_at) SELECT id, received_at, source, delivery_id, body, 'retry', 1,"
        " clock_timestamp() - interval '1 second' FROM webhook_inbox WHERE id = ANY ($1::bigint[])",
        ids,
    )
    consumer = Consumer(pool, s, health=ConsumerHealth(time.monotonic))
    assert [await consumer.process_items() for _ in range(3)] == [2, 1, 0]
    assert await pool.fetchval("SELECT array_agg(state) FROM inbox_parked") == ["done"] * 3
    # Their events were processed by the first pass: the retries found them duplicates.
    assert await pool.fetchval("SELECT count(*) FROM inbound_messages") == 3


COUNT_TRIES = """
CREATE SEQUENCE message_inserts;
CREATE FUNCTION count_message_inserts() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM nextval('message_inserts'); RETURN NULL; END $$;
CREATE TRIGGER count_message_inserts BEFORE INSERT ON inbound_messages
    FOR EACH STATEMENT EXECUTE FUNCTION count_message_inserts();
"""


@needs_trigger
async def test_a_poisoned_event_is_found_by_halving_the_batch_not_one_event_at_a_time(
    pool: asyncpg.Pool, settings: Settings
) -> None:
    # A sequence is not rolled back with a savepoint: it counts every statement that tried to
    # insert messages, those that failed included.
    await pool.execute(POISON_TRIGGER + COUNT_TRIES)
    s = replace(settings, max_attempts=3, retry_base_ms=60000, retry_max_ms=60000, consumer_batch=10)
    msgs = [message_obj(f"wamid.H{i}") for i in range(64)]
    msgs[40] = message_obj("wamid.POISON")
    await stage(pool, to_bytes(messages_payload(*msgs)))
    await drain(pool, s)
    assert await pool.fetchval("SELECT count(*) FROM inbound_messages") == 63
    assert await pool.fetchval("SELECT count(DISTINCT event_key) FROM processed_webhook_events") == 63
    item = await pool.fetchrow("SELECT event_key, state, path FROM dead_events")
    assert (item["event_key"], item["state"]) == ("msg:wamid.POISON", "retry")
    assert item["path"] == "/entry/0/changes/0/value/messages/40"
    # The batch, then halves of 32, 16 and 8 events, then the last 8 one by one, then the
    # statement that moves the cursor: 16 statements, where one event at a time took 66.
    tries = await pool.fetchval("SELECT last_value FROM message_inserts")
    assert tries == 1 + 2 + 2 + 2 + 8 + 1


async def test_unparseable_body_parked_at_once_with_bytes_intact(
    http: ClientSession, gateway: TestServer, pool: asyncpg.Pool, settings: Settings
) -> None:
    bad = b'{"object": "whatsapp_business_account", "entry": [\xff\x00 truncated'
    odd = b'{"object": "instagram", "entry": []}'
    good = to_bytes(messages_payload(message_obj("wamid.GOOD")))
    for body in (bad, good, odd):
        assert (await post_meta(http, gateway, body))[0] == 200
    await drain(pool, settings)
    rows = await pool.fetch(
        "SELECT w.body, s.state, coalesce(p.attempts, 0) AS attempts, p.last_error FROM webhook_inbox w"
        " JOIN inbox_row_states() s ON s.id = w.id LEFT JOIN inbox_parked p ON p.inbox_id = w.id"
        " ORDER BY w.id"
    )
    assert [bytes(r["body"]) for r in rows] == [bad, good, odd]
    assert [(r["state"], r["attempts"]) for r in rows] == [("dead", 1), ("done", 0), ("dead", 1)]
    assert rows[0]["last_error"].startswith("NotJson")
    assert rows[2]["last_error"].startswith("UnknownShape")
    assert await pool.fetchval("SELECT count(*) FROM inbound_messages") == 1


async def test_crash_mid_batch_rolls_back_keys_and_effects(
    pool: asyncpg.Pool, settings: Settings, db_dsn: str
) -> None:
    # A consumer whose connection dies after apply_batch but before COMMIT leaves nothing behind.
    await stage(pool, to_bytes(messages_payload(message_obj("wamid.CRASH"))))
    conn = await asyncpg.connect(db_dsn)
    from gateway.core.lanes import LaneSet, advance
    from gateway.core.planning import plan_batch
    from gateway.inbound.lanes import LaneLease
    from gateway.store.db import init_connection

    await init_connection(conn)
    lanes = LaneSet()
    lease = LaneLease(settings, lanes)
    await lease.refresh(conn)
    tried: set[int] = set()
    while True:  # the shard whose lanes hold the row (on one server, the only one)
        taken = lanes.take(skip=tried)
        assert taken, "the staged row is in no lane"
        tried.add(lanes.shards.get(taken[0].lane, 0))
        batch = await inbox.read(conn, taken, limit=10, max_bytes=1 << 20)
        if batch.rows:
            break
    assert batch.snapshots
    last = batch.rows[-1]
    moved = advance(taken, batch.snapshots, (last.txid, last.id), batch.exhausted)
    tr = conn.transaction()
    await tr.start()
    await inbox.apply_plan(
        conn,
        plan_batch(batch.rows),
        member=lease.member,
        advance=inbox.advance_arg(taken, moved),
        citus=on_cluster(),
    )
    pid = conn.get_server_pid()
    conn.terminate()
    # The server rolls the transaction back when it sees the socket close.
    while await pool.fetchval("SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid):
        await asyncio.sleep(0.01)
    await drain(pool, settings)
    c = await counts(pool)
    assert (c["processed_webhook_events"], c["inbound_messages"]) == (1, 1)
    assert await inbox_states(pool) == {"done": 1}
