"""Handlers run inside the consumer's transaction: exactly once per event, isolated on failure."""

from __future__ import annotations

import asyncio
import time

import asyncpg
import pytest

from examples import echo_bot, order_updater
from gateway.core.events import InboundMessage
from gateway.core.faults import ConsumerHealth
from gateway.core.settings import Settings
from gateway.handlers import HANDLER_TENANT, Registry, reply
from gateway.inbound.consumer import Consumer
from gateway.testing.payloads import message_obj, messages_payload, status_obj, statuses_payload, to_bytes
from tests.support.config import replace
from tests.support.consume import add_outbox, inbox_states, stage
from tests.support.handlers import RECORD, TABLE, on_message, register
from tests.support.procs import gateway_ok


async def drain(
    pool: asyncpg.Pool, s: Settings, registry: Registry, health: ConsumerHealth, consumers: int = 1
) -> None:
    workers = [Consumer(pool, s, handlers=registry, health=health) for _ in range(consumers)]

    async def loop(c: Consumer) -> None:
        for _ in range(500):
            if not await c.step():
                return

    await asyncio.gather(*(loop(c) for c in workers))


async def handled(pool: asyncpg.Pool) -> dict[str, int]:
    rows = await pool.fetch("SELECT event_key, count(*) AS n FROM handled GROUP BY event_key")
    return {r["event_key"]: r["n"] for r in rows}


@pytest.fixture
async def sample(pool: asyncpg.Pool) -> Registry:
    await pool.execute(TABLE)
    return register(Registry())


async def test_handlers_run_once_per_event_across_redeliveries(
    pool: asyncpg.Pool, settings: Settings, sample: Registry
) -> None:
    body = to_bytes(messages_payload(message_obj("wamid.H1"), message_obj("wamid.H2")))
    status = to_bytes(statuses_payload(status_obj("wamid.OUT", "read")))
    health = ConsumerHealth(time.monotonic)
    for _ in range(3):
        for _ in range(4):  # redeliveries, some in one batch, with concurrent consumers
            await stage(pool, body)
            await stage(pool, status)
        await drain(pool, replace(settings, consumer_batch=3), sample, health, consumers=3)
    assert await handled(pool) == {"msg:wamid.H1": 1, "msg:wamid.H2": 1, "status:wamid.OUT:read:": 1}
    assert await inbox_states(pool) == {"done": 24}


async def test_a_raising_handler_fails_only_its_event_then_replay_runs_it_once(
    pool: asyncpg.Pool, settings: Settings, sample: Registry, db_dsn: str
) -> None:
    s = replace(settings, max_attempts=2, retry_base_ms=60000, retry_max_ms=60000)
    health = ConsumerHealth(time.monotonic)
    msgs = [message_obj("wamid.A"), message_obj("wamid.RAISE1"), message_obj("wamid.B")]
    await stage(pool, to_bytes(messages_payload(*msgs)))
    await stage(pool, to_bytes(statuses_payload(status_obj("wamid.OUT", "sent"))))
    await drain(pool, s, sample, health)
    # The rest of the batch committed with its handlers' writes; the raising handler's write
    # rolled back with its event.
    assert await handled(pool) == {"msg:wamid.A": 1, "msg:wamid.B": 1, "status:wamid.OUT:sent:": 1}
    keys = {r[0] for r in await pool.fetch("SELECT event_key FROM processed_webhook_events")}
    assert "msg:wamid.RAISE1" not in keys and len(keys) == 3
    assert await inbox_states(pool) == {"done": 2}
    item = await pool.fetchrow("SELECT id, state, attempts, last_error FROM dead_events")
    assert item["state"] == "retry" and item["attempts"] == 1
    assert item["last_error"] == (
        "handler tests.support.handlers.on_message: ValueError: cannot handle wamid.RAISE1"
    )
    # Not retried before its backoff; then (other messages went through since) the next
    # failure is again the event's own: its last attempt, dead.
    await drain(pool, s, sample, health)
    assert await pool.fetchval("SELECT attempts FROM dead_events") == 1
    await pool.execute("UPDATE dead_events SET next_attempt_at = clock_timestamp()")
    await drain(pool, s, sample, health)
    row = await pool.fetchrow("SELECT state, attempts FROM dead_events")
    assert (row["state"], row["attempts"]) == ("dead", 2)
    assert await handled(pool) == {"msg:wamid.A": 1, "msg:wamid.B": 1, "status:wamid.OUT:sent:": 1}
    # Fixed (here: the handler no longer raises for it), replayed: handled exactly once.
    fixed = Registry()
    fixed.message()(lambda ev, conn: conn.execute(RECORD, ev.key, "fixed"))
    out = await gateway_ok(db_dsn, "dead", "replay", f"E{item['id']}")
    assert f"replayed 1 event(s): [{item['id']}]" in out
    await drain(pool, s, fixed, health)
    await drain(pool, s, fixed, health)
    n = await pool.fetchval(
        "SELECT count(*) FROM handled WHERE event_key = 'msg:wamid.RAISE1' AND handler = 'fixed'"
    )
    assert n == 1
    assert await pool.fetchval("SELECT state FROM dead_events") == "done"


async def test_an_event_whose_handler_raised_is_not_run_again_in_its_batch(
    pool: asyncpg.Pool, settings: Settings
) -> None:
    # A handler that raised names its event: the batch is applied again around it, and the
    # event waits for its backoff instead of being tried again at once.
    await pool.execute(TABLE)
    calls: dict[str, int] = {}

    async def counted(ev: InboundMessage, conn: asyncpg.Connection) -> None:
        calls[ev.key] = calls.get(ev.key, 0) + 1
        await on_message(ev, conn)

    registry = Registry()
    registry.message()(counted)
    bad = {5, 20, 33}
    msgs = [message_obj(f"wamid.RAISE{i}" if i in bad else f"wamid.OK{i}") for i in range(40)]
    await stage(pool, to_bytes(messages_payload(*msgs)))
    s = replace(settings, retry_base_ms=60000, retry_max_ms=60000)
    await drain(pool, s, registry, ConsumerHealth(time.monotonic))
    assert await handled(pool) == {f"msg:wamid.OK{i}": 1 for i in range(40) if i not in bad}
    items = await pool.fetch("SELECT event_key, attempts FROM dead_events ORDER BY position")
    assert [(r["event_key"], r["attempts"]) for r in items] == [
        (f"msg:wamid.RAISE{i}", 1) for i in sorted(bad)
    ]
    assert {k: n for k, n in calls.items() if "RAISE" in k} == {f"msg:wamid.RAISE{i}": 1 for i in bad}
    # Going one event at a time would call every handler once more than the batch did.
    assert sum(calls.values()) < 40 + len(calls)


@pytest.mark.parametrize("wamid", ["wamid.SLOW1", "wamid.SLOWSQL1"])
async def test_a_handler_past_its_timeout_fails_only_its_event(
    pool: asyncpg.Pool, settings: Settings, sample: Registry, wamid: str
) -> None:
    s = replace(settings, handler_timeout_ms=200, retry_base_ms=60000, retry_max_ms=60000)
    msgs = [message_obj("wamid.A"), message_obj(wamid), message_obj("wamid.B")]
    await stage(pool, to_bytes(messages_payload(*msgs)))
    await drain(pool, s, sample, ConsumerHealth(time.monotonic))
    assert set(await handled(pool)) == {"msg:wamid.A", "msg:wamid.B"}
    item = await pool.fetchrow("SELECT event_key, state, attempts, last_error FROM dead_events")
    assert (item["event_key"], item["state"], item["attempts"]) == (f"msg:{wamid}", "retry", 1)
    assert item["last_error"] == "handler tests.support.handlers.on_message: timed out"
    # The connection is usable after the cancelled statement.
    assert await pool.fetchval("SELECT count(*) FROM inbound_messages") == 2


async def test_echo_bot_answers_each_text_message_once(pool: asyncpg.Pool, settings: Settings) -> None:
    bot = Registry()
    bot.message(type="text")(echo_bot.echo)
    health = ConsumerHealth(time.monotonic)
    body = to_bytes(
        messages_payload(message_obj("wamid.E1", text="hello"), message_obj("wamid.E2", text="bye"))
    )
    for _ in range(3):
        await stage(pool, body)
        await drain(pool, settings, bot, health, consumers=2)
    rows = await pool.fetch(
        "SELECT tenant, idem_key, recipient, payload, state FROM outbox ORDER BY idem_key"
    )
    assert [(r["tenant"], r["idem_key"], r["state"]) for r in rows] == [
        ("handlers", "reply:echo:wamid.E1", "pending"),
        ("handlers", "reply:echo:wamid.E2", "pending"),
    ]
    assert rows[0]["payload"] == {
        "type": "text",
        "text": {"body": "You said: hello"},
        "context": {"message_id": "wamid.E1"},
    }
    claims = await pool.fetch("SELECT inbound_wamid, claimed_by FROM reply_claims ORDER BY 1")
    assert [tuple(r) for r in claims] == [("wamid.E1", "echo"), ("wamid.E2", "echo")]


async def test_order_updater_keeps_orders_in_step_with_statuses(
    pool: asyncpg.Pool, settings: Settings
) -> None:
    with open(order_updater.__file__.replace(".py", ".sql")) as f:
        await pool.execute(f.read())
    await pool.execute(
        "INSERT INTO orders (id, callback_data) VALUES ('o-1', 'shop:o-1'), ('o-2', 'shop:o-2')"
    )
    await add_outbox(pool, "shop:o-1")
    updater = Registry()
    updater.status()(order_updater.track_delivery)
    health = ConsumerHealth(time.monotonic)
    err = [{"code": 131026, "title": "Message undeliverable"}]
    arrivals = [
        status_obj("wamid.O1", "read", callback="shop:o-1"),
        status_obj("wamid.O1", "sent", callback="shop:o-1"),  # late: never moves it back
        status_obj("wamid.O2", "sent", callback="shop:o-2"),
        status_obj("wamid.O2", "failed", callback="shop:o-2", errors=err),
        status_obj("wamid.X", "read"),  # not an order
    ]
    for st in arrivals + arrivals[:2]:
        await stage(pool, to_bytes(statuses_payload(st)))
        await drain(pool, settings, updater, health)
    rows = await pool.fetch("SELECT id, wamid, delivery, delivery_errors FROM orders ORDER BY id")
    assert [tuple(r) for r in rows] == [("o-1", "wamid.O1", "read", None), ("o-2", "wamid.O2", "failed", err)]


async def test_handlers_plan_their_statements_with_the_sessions_setting(
    pool: asyncpg.Pool, settings: Settings
) -> None:
    """The batch statement is planned generically (a setting local to the fast path); a
    handler's own statements, in the same transaction, get the session's setting back."""
    seen: list[str] = []

    async def record(ev: object, conn: asyncpg.Connection) -> None:
        seen.append(await conn.fetchval("SELECT current_setting('plan_cache_mode')"))

    reg = Registry()
    reg.message()(record)
    await stage(pool, to_bytes(messages_payload(message_obj("wamid.PLAN1"), message_obj("wamid.PLAN2"))))
    await drain(pool, settings, reg, ConsumerHealth(time.monotonic))
    assert seen == ["auto", "auto"]


async def test_handler_replies_follow_the_per_bot_rule_of_the_consumer_running_them(
    pool: asyncpg.Pool, settings: Settings
) -> None:
    """GATEWAY_REPLY_PER_BOT_TENANTS as the consumer running the handler has it, whichever
    consumers were made since in the same process (and reply() outside one: once per message)."""
    answered: list[bool] = []

    async def two_bots(ev: InboundMessage, conn: asyncpg.Connection) -> None:
        for bot in ("orders", "survey"):
            answered.append(await reply(conn, ev, bot=bot, text="hi"))

    reg = Registry()
    reg.message()(two_bots)
    health = ConsumerHealth(time.monotonic)
    per_bot = Consumer(
        pool, replace(settings, reply_per_bot_tenants=(HANDLER_TENANT,)), handlers=reg, health=health
    )
    once = Consumer(pool, settings, handlers=reg, health=health)  # made after: its rule is its own
    await stage(pool, to_bytes(messages_payload(message_obj("wamid.PB1"))))
    while await per_bot.step():
        pass
    await stage(pool, to_bytes(messages_payload(message_obj("wamid.PB2"))))
    while await once.step():
        pass
    assert answered == [True, True, True, False]
    keys = [r["idem_key"] for r in await pool.fetch("SELECT idem_key FROM outbox ORDER BY idem_key")]
    assert keys == ["reply:orders:wamid.PB1", "reply:orders:wamid.PB2", "reply:survey:wamid.PB1"]
