"""Faults and bad events against a real PostgreSQL: a failing database never dead-letters an
acknowledged webhook; a bad event is parked on its own, with its bytes, after its attempts."""

from __future__ import annotations

import asyncio
import itertools
import time
from datetime import UTC, datetime, timedelta

import asyncpg
import orjson
import pytest

from gateway.core.faults import ConsumerHealth
from gateway.core.settings import Settings
from gateway.inbound.consumer import Consumer
from gateway.store import inbox
from gateway.store.db import create_pool
from gateway.testing.payloads import (
    message_obj,
    messages_payload,
    meta_payload,
    meta_value,
    status_obj,
    statuses_payload,
    to_bytes,
)
from tests.support.citus_db import on_cluster
from tests.support.config import replace
from tests.support.consume import counts, drain, inbox_states, leased, stage
from tests.support.forward import until
from tests.support.parses import count_parses
from tests.support.procs import gateway_ok

# Faults that hit every message alike, injected for a while and then removed.
FAULTS = {
    # A trigger that raises (SQLSTATE P0001): a rule of the data, each event's own failure.
    "trigger": (
        (
            """CREATE FUNCTION fault() RETURNS trigger LANGUAGE plpgsql AS $$
               BEGIN RAISE EXCEPTION 'injected fault'; END $$""",
            "CREATE TRIGGER fault BEFORE INSERT ON inbound_messages FOR EACH ROW EXECUTE FUNCTION fault()",
        ),
        ("DROP TRIGGER fault ON inbound_messages", "DROP FUNCTION fault()"),
    ),
    # A constraint from a newer replica that this code's rows do not satisfy (23514).
    "check": (
        ("ALTER TABLE inbound_messages ADD CONSTRAINT newer CHECK (type <> 'text') NOT VALID",),
        ("ALTER TABLE inbound_messages DROP CONSTRAINT newer",),
    ),
    # The data volume is full (53100): systemic by its SQLSTATE class, and a probe (a harmless
    # message through the same trigger) fails too.
    "disk_full": (
        (
            """CREATE FUNCTION fault() RETURNS trigger LANGUAGE plpgsql AS $$
               BEGIN RAISE EXCEPTION 'could not extend file' USING ERRCODE = 'disk_full'; END $$""",
            "CREATE TRIGGER fault BEFORE INSERT ON inbound_messages FOR EACH ROW EXECUTE FUNCTION fault()",
        ),
        ("DROP TRIGGER fault ON inbound_messages", "DROP FUNCTION fault()"),
    ),
}


async def ddl(pool: asyncpg.Pool, *statements: str) -> None:
    """Inject or remove a fault (removed with its function: a Citus run then reuses the
    database, its schema unchanged): one statement at a time (Citus passes a statement on to the
    shards with the whole text it was given), triggers allowed on a cluster's distributed
    tables (citus.enable_unsafe_triggers: Citus refuses them otherwise)."""
    async with pool.acquire() as conn:
        if on_cluster():
            await conn.execute("SET citus.enable_unsafe_triggers = on")
        try:
            for sql in statements:
                await conn.execute(sql)
        finally:
            if on_cluster():
                await conn.execute("RESET citus.enable_unsafe_triggers")


def poison_trigger(condition: str) -> tuple[str, str]:
    """A trigger that rejects the inbound messages matching ``condition`` (on NEW)."""
    return (
        f"""CREATE FUNCTION poison() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN IF {condition} THEN RAISE EXCEPTION 'poison'; END IF; RETURN NEW; END $$""",
        "CREATE TRIGGER poison BEFORE INSERT ON inbound_messages FOR EACH ROW EXECUTE FUNCTION poison()",
    )


def fast(settings: Settings, **kw: object) -> Settings:
    base = {"max_attempts": 2, "retry_base_ms": 1, "retry_max_ms": 5, "fault_backoff_max_ms": 5}
    return replace(settings, **{**base, **kw})


async def no_dead(pool: asyncpg.Pool) -> None:
    assert await pool.fetchval("SELECT count(*) FROM inbox_row_states() WHERE state = 'dead'") == 0
    assert await pool.fetchval("SELECT count(*) FROM dead_events WHERE state = 'dead'") == 0


async def stage_faulted(pool: asyncpg.Pool, n: int, with_statuses: bool) -> None:
    for i in range(n):
        sts = [status_obj(f"wamid.out{i}", "delivered")] if with_statuses else None
        value = meta_value(messages=[message_obj(f"wamid.F{i}")], statuses=sts)
        await stage(pool, to_bytes(meta_payload(("messages", value))))


@pytest.mark.parametrize("with_statuses", [False, True])
@pytest.mark.citus
async def test_a_systemic_fault_for_a_while_parks_nothing_dead(
    pool: asyncpg.Pool, settings: Settings, with_statuses: bool
) -> None:
    s = fast(settings, consumer_batch=7)
    health = ConsumerHealth(time.monotonic)
    await stage(pool, to_bytes(messages_payload(message_obj("wamid.BEFORE"))))
    await drain_with(pool, s, health)
    inject, remove = FAULTS["disk_full"]
    await ddl(pool, *inject)
    n = 20
    await stage_faulted(pool, n, with_statuses)
    # The fault lasts for many more retries than max_attempts (2) would allow.
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:
        await drain_with(pool, s, health, max_steps=3)
        await no_dead(pool)
        await asyncio.sleep(0.01)
    assert await pool.fetchval("SELECT coalesce(max(attempts), 0) FROM dead_events") == 0
    assert await pool.fetchval("SELECT count(*) FROM inbox_parked") == 0
    assert await pool.fetchval("SELECT count(*) FROM inbound_messages") == 1
    # The waiting events show as lag: their rows are pending.
    assert await pool.fetchval("SELECT count(*) FROM inbox_row_states() WHERE state = 'pending'") == n
    assert await inbox.lag_seconds(pool) > 0
    await ddl(pool, *remove)
    await asyncio.sleep(0.05)
    await drain_with(pool, s, health)
    await no_dead(pool)
    assert await inbox_states(pool) == {"done": n + 1}
    c = await counts(pool)
    assert c["inbound_messages"] == n + 1
    assert c["message_statuses"] == (n if with_statuses else 0)


@pytest.mark.parametrize("fault", ["trigger", "check"])
@pytest.mark.citus
async def test_a_data_rule_that_rejects_every_message_is_each_events_own(
    pool: asyncpg.Pool, settings: Settings, db_dsn: str, fault: str
) -> None:
    """The pipeline never stops for it: the other events commit, the rows are done, each
    rejected message is a dead item with its bytes after its attempts, and a replay once
    the rule is fixed processes each exactly once."""
    s = fast(settings, consumer_batch=7)
    health = ConsumerHealth(time.monotonic)
    inject, remove = FAULTS[fault]
    await ddl(pool, *inject)
    n = 10
    await stage_faulted(pool, n, with_statuses=True)
    deadline = time.monotonic() + 60  # a bound on the test, not a speed claim
    while await pool.fetchval("SELECT count(*) FROM dead_events WHERE state <> 'dead'") or (
        await pool.fetchval("SELECT count(*) FROM dead_events") < n
    ):
        assert time.monotonic() < deadline
        await drain_with(pool, s, health, max_steps=5)
        await asyncio.sleep(0.01)
    assert await inbox_states(pool) == {"done": n}
    assert (await counts(pool))["message_statuses"] == n  # the statuses went through at once
    items = await pool.fetch("SELECT state, attempts, kind, fragment FROM dead_events")
    assert {(r["state"], r["attempts"], r["kind"]) for r in items} == {("dead", 2, "message")}
    # Each message's own bytes (in the order the batches met them: on a cluster a batch reads
    # the lanes shard by shard, so not the order they were staged in).
    fragments = sorted(orjson.loads(bytes(r["fragment"]))["id"] for r in items)
    assert fragments == sorted(f"wamid.F{i}" for i in range(n))
    assert health.fault_streak == 0
    await ddl(pool, *remove)
    assert f"replayed {n} event(s)" in await gateway_ok(db_dsn, "dead", "replay", "--all")
    await drain_with(pool, s, health)
    assert await pool.fetchval("SELECT count(*) FROM inbound_messages") == n
    assert await pool.fetchval("SELECT count(DISTINCT wamid) FROM inbound_messages") == n
    assert await pool.fetchval("SELECT count(*) FROM dead_events WHERE state <> 'done'") == 0


@pytest.mark.citus
async def test_a_group_statuss_participants_retried_parse_their_fragment_once_a_claim(
    pool: asyncpg.Pool, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A group status listing n participants is n events, n dead items of one fragment when
    they all fail; their retries parse it once per claim, not once per item (n² events), and
    each participant's status is then stored exactly once."""
    n, claim = 120, 50
    s = fast(settings, consumer_batch=claim, max_attempts=8)
    health = ConsumerHealth(time.monotonic)
    await ddl(
        pool,
        """CREATE FUNCTION poison() RETURNS trigger LANGUAGE plpgsql AS $$
           BEGIN IF NEW.wamid = 'wamid.GROUP' THEN RAISE EXCEPTION 'poison'; END IF; RETURN NEW; END $$""",
        "CREATE TRIGGER poison BEFORE INSERT ON message_statuses FOR EACH ROW EXECUTE FUNCTION poison()",
    )
    people = [f"49151{i:08d}" for i in range(n)]
    await stage(pool, to_bytes(statuses_payload(status_obj("wamid.GROUP", "read", participant=people))))
    deadline = time.monotonic() + 60  # a bound on the test, not a speed claim
    while await pool.fetchval("SELECT count(*) FROM dead_events") < n:
        assert time.monotonic() < deadline
        await drain_with(pool, s, health, max_steps=1)
    assert await pool.fetchval("SELECT count(DISTINCT event_key) FROM dead_events WHERE state = 'retry'") == n
    await ddl(pool, "DROP TRIGGER poison ON message_statuses", "DROP FUNCTION poison()")
    parsed = count_parses(monkeypatch)
    while await pool.fetchval("SELECT count(*) FROM dead_events WHERE state <> 'done'"):
        assert time.monotonic() < deadline
        await drain_with(pool, s, health)
    rows = await pool.fetch("SELECT participant FROM message_statuses WHERE wamid = 'wamid.GROUP'")
    assert sorted(r["participant"] for r in rows) == people
    # Per item, the retries would parse it n times; a claim takes at most `claim` items.
    assert 1 <= len(parsed) <= 2 * -(-n // claim), len(parsed)


async def drain_with(
    pool: asyncpg.Pool, settings: Settings, health: ConsumerHealth, max_steps: int = 200
) -> None:
    """Step until nothing is due (bounded: during a fault, deferred work keeps coming due)."""
    c = Consumer(pool, settings, health=health)
    for _ in range(max_steps):
        if not await c.step():
            return


async def test_system_fault_writes_nothing_and_the_consumer_backs_off(
    db_dsn: str, settings: Settings
) -> None:
    inject, remove = FAULTS["disk_full"]
    pool = await create_pool(db_dsn, 1, 2)
    try:
        await ddl(pool, *inject)
        for i in range(3):
            await stage(pool, to_bytes(messages_payload(message_obj(f"wamid.D{i}"))))
        s = replace(settings, retry_base_ms=2000, fault_backoff_max_ms=4000)
        reads: list[str] = []
        async with pool.acquire() as one, pool.acquire() as two:
            for conn in (one, two):
                conn.add_query_logger(
                    lambda rec: reads.append(rec.query) if "AS taken" in rec.query else None
                )
        consumer = await leased(pool, s, health=ConsumerHealth(time.monotonic))
        stop = asyncio.Event()
        task = asyncio.create_task(consumer.run(stop))
        try:
            await until(lambda: _one(reads), what="the first read")
            await asyncio.sleep(0.8)
            # It read once, found the database failing (a probe confirmed it) and waits its
            # backoff (at least a second with these settings) before reading again.
            assert len(reads) == 1
        finally:
            stop.set()
            consumer.wake()
            await task
        # Nothing was written: no attempt, no dead item, nothing moved aside; the rows wait as lag.
        await no_dead(pool)
        assert await pool.fetchval("SELECT count(*) FROM dead_events") == 0
        assert await pool.fetchval("SELECT count(*) FROM inbox_parked") == 0
        assert await inbox_states(pool) == {"pending": 3}
        assert await inbox.lag_seconds(pool) > 0
        await ddl(pool, *remove)
        while await consumer.process_batch():
            pass
        assert await inbox_states(pool) == {"done": 3}
    finally:
        await pool.close()


async def _one(reads: list[str]) -> bool:
    return len(reads) >= 1


@pytest.mark.citus
async def test_poison_event_attempts_honour_the_backoff(pool: asyncpg.Pool, settings: Settings) -> None:
    await ddl(pool, *poison_trigger("NEW.wamid = 'wamid.POISON'"))
    # On a cluster a round of this loop (stage, three consumer steps) can take longer than the
    # backoff, and an attempt would go unseen: the backoff is longer there.
    base_ms = 1500 if on_cluster() else 300
    s = replace(settings, max_attempts=3, retry_base_ms=base_ms, retry_max_ms=base_ms)
    health = ConsumerHealth(time.monotonic)
    body = to_bytes(messages_payload(message_obj("wamid.OK0"), message_obj("wamid.POISON")))
    await stage(pool, body)
    consumers = [Consumer(pool, s, health=health) for _ in range(3)]
    # Each attempt as the database timed it (updated_at: when the failure was recorded), not
    # as this loop happens to notice it.
    seen: list[tuple[datetime, int]] = []
    started = time.monotonic()
    i = 0
    while time.monotonic() - started < 30:  # a bound on the test, not a speed claim
        # Other messages keep flowing, so every failure of the poison is its own.
        i += 1
        await stage(pool, to_bytes(messages_payload(message_obj(f"wamid.OK{i}"))))
        await asyncio.gather(*(c.step() for c in consumers))
        row = await pool.fetchrow("SELECT state, attempts, updated_at FROM dead_events")
        if row is None:  # on a cluster a step reads a few shards' lanes: not the poison's yet
            continue
        if not seen or seen[-1][1] != row["attempts"]:
            seen.append((row["updated_at"], row["attempts"]))
        if row["state"] == "dead":
            break
        await asyncio.sleep(0.01)
    assert row["state"] == "dead" and row["attempts"] == 3
    assert [a for _, a in seen] == [1, 2, 3]
    # Attempts are spread by the backoff (half of base_ms to all of it, with full jitter), never
    # a burst.
    gaps = [(b - a).total_seconds() for (a, _), (b, _) in itertools.pairwise(seen)]
    assert all(g >= base_ms / 2000 - 0.001 for g in gaps), gaps  # less the microseconds of one UPDATE
    await drain_with(pool, s, health)  # the last messages staged
    assert await pool.fetchval("SELECT count(*) FROM inbox_row_states() WHERE state <> 'done'") == 0
    await ddl(pool, "DROP TRIGGER poison ON inbound_messages", "DROP FUNCTION poison()")


# A POST whose second message has no id, spelled the way a sender might (spaces, escapes).
ODD_MESSAGE = b'{ "from" : "4915112345678",  "type":"text", "text": {"body": "caf\\u00e9"} }'


def body_with(fragment: bytes) -> bytes:
    good = [orjson.dumps(message_obj(f"wamid.G{i}")) for i in range(3)]
    msgs = b",".join([good[0], fragment, good[1], good[2]])
    return (
        b'{"object":"whatsapp_business_account","entry":[{"id":"waba-0","changes":[{"field":"messages",'
        b'"value":{"metadata":{"phone_number_id":"1111"},"messages":[' + msgs + b"]}}]}]}"
    )


@pytest.mark.citus
async def test_message_without_id_is_its_own_dead_item_with_its_exact_bytes(
    pool: asyncpg.Pool, settings: Settings, db_dsn: str
) -> None:
    inbox_id = await stage(pool, body_with(ODD_MESSAGE))
    await drain(pool, settings)
    assert await inbox_states(pool) == {"done": 1}
    assert await pool.fetchval("SELECT count(*) FROM inbound_messages") == 3
    item = await pool.fetchrow("SELECT * FROM dead_events")
    assert (item["inbox_id"], item["state"], item["kind"], item["event_key"]) == (
        inbox_id,
        "dead",
        "bad",
        None,
    )
    assert item["path"] == "/entry/0/changes/0/value/messages/1"
    assert bytes(item["fragment"]) == ODD_MESSAGE
    assert "without a string 'id'" in item["last_error"]
    out = await gateway_ok(db_dsn, "dead", "show", f"E{item['id']}", "--raw")
    assert out.encode() == ODD_MESSAGE
    # A redelivery of the POST: the good events are duplicates, the bad one parked again.
    await stage(pool, body_with(ODD_MESSAGE))
    await drain(pool, settings)
    assert await pool.fetchval("SELECT count(*) FROM inbound_messages") == 3
    assert await pool.fetchval("SELECT count(*) FROM dead_events WHERE state = 'dead'") == 2


@pytest.mark.citus
@pytest.mark.parametrize(
    ("fragment", "stored"),
    [
        # U+0000: text and jsonb refuse it; stored as the six characters of its escape.
        (b'{"from":"4915","id":"wamid.NUL","type":"text","text":{"body":"a\\u0000b"}}', "a\\u0000b"),
        # A lone surrogate (not UTF-8): orjson refuses the whole body; the stdlib parses it.
        (b'{"from":"4915","id":"wamid.SUR","type":"text","text":{"body":"x\\ud800y"}}', "x\\ud800y"),
    ],
)
async def test_values_postgres_cannot_store_are_escaped_and_kept_exactly(
    pool: asyncpg.Pool, settings: Settings, fragment: bytes, stored: str
) -> None:
    wamid = orjson.loads(fragment.replace(b"\\u0000", b"").replace(b"\\ud800", b""))["id"]
    for _ in range(2):  # a redelivery changes nothing
        await stage(pool, body_with(fragment))
        await drain(pool, settings)
    assert await inbox_states(pool) == {"done": 2}
    assert await pool.fetchval("SELECT count(*) FROM dead_events") == 0
    assert await pool.fetchval("SELECT count(*) FROM inbound_messages") == 4
    msg = await pool.fetchval("SELECT message FROM inbound_messages WHERE wamid = $1", wamid)
    assert msg["text"]["body"] == stored
    raw = await pool.fetchrow(
        "SELECT path, fragment FROM event_fragments WHERE event_key = $1", f"msg:{wamid}"
    )
    assert (raw["path"], bytes(raw["fragment"])) == ("/entry/0/changes/0/value/messages/1", fragment)
    assert await pool.fetchval("SELECT count(*) FROM event_fragments") == 1


@pytest.mark.citus
async def test_dead_list_and_replay_by_time_range(
    pool: asyncpg.Pool, settings: Settings, db_dsn: str
) -> None:
    await ddl(pool, *poison_trigger("NEW.wamid LIKE 'wamid.P%'"))
    s = fast(settings, max_attempts=1)
    health = ConsumerHealth(time.monotonic)
    for day in range(3):
        await stage(
            pool, to_bytes(messages_payload(message_obj(f"wamid.OK{day}"), message_obj(f"wamid.P{day}")))
        )
    await stage(pool, b"not json")
    await drain_with(pool, s, health)
    assert await pool.fetchval("SELECT count(*) FROM dead_events WHERE state = 'dead'") == 3
    # Received one, two and three days ago.
    now = datetime.now(UTC)
    # (The times are computed in the sub-select: a Citus cluster refuses a stable function over
    # a column in an UPDATE; staging order is receipt order, ids come from each worker there.)
    await pool.execute(
        """WITH w AS MATERIALIZED (
               SELECT id, $1::timestamptz - make_interval(days => 3 - (n - 1)::int) AS at
               FROM (SELECT id, row_number() OVER (ORDER BY received_at, id) AS n FROM webhook_inbox) r)
           UPDATE dead_events d SET received_at = w.at FROM w WHERE w.id = d.inbox_id""",
        now,
    )
    since = (now - timedelta(days=2, hours=12)).isoformat()
    until = (now - timedelta(hours=12)).isoformat()
    out = await gateway_ok(db_dsn, "dead", "list", "--since", since, "--until", until)
    assert "key=msg:wamid.P1" in out and "key=msg:wamid.P2" in out and "wamid.P0" not in out
    assert "2 dead event(s)" in out
    out = await gateway_ok(db_dsn, "dead", "list", "--since", "36h")
    assert "key=msg:wamid.P2" in out and "1 dead event(s)" in out and "1 dead row(s)" in out
    await ddl(pool, "DROP TRIGGER poison ON inbound_messages", "DROP FUNCTION poison()")
    out = await gateway_ok(db_dsn, "dead", "replay", "--since", since, "--until", until)
    assert "replayed 2 event(s)" in out and "no row to replay" in out
    await drain_with(pool, s, health)
    done = {r[0] for r in await pool.fetch("SELECT wamid FROM inbound_messages WHERE wamid LIKE 'wamid.P%'")}
    assert done == {"wamid.P1", "wamid.P2"}
    assert await pool.fetchval("SELECT count(*) FROM dead_events WHERE state = 'dead'") == 1


async def test_statement_timeout_defers_without_attempts(db_dsn: str, settings: Settings) -> None:
    """A statement timeout (57014) is the system failing: nothing counted, nothing dead."""
    from gateway.store.db import init_connection

    slow = await asyncpg.create_pool(
        db_dsn, min_size=1, max_size=2, init=init_connection, server_settings={"statement_timeout": "100"}
    )
    assert slow is not None
    try:
        await slow.execute(
            """CREATE FUNCTION slow() RETURNS trigger LANGUAGE plpgsql AS $$
               BEGIN PERFORM pg_sleep(0.3); RETURN NEW; END $$;
               CREATE TRIGGER slow BEFORE INSERT ON inbound_messages FOR EACH ROW EXECUTE FUNCTION slow();"""
        )
        for i in range(3):
            await stage(slow, to_bytes(messages_payload(message_obj(f"wamid.T{i}"))))
        s = fast(settings, max_attempts=1)
        health = ConsumerHealth(time.monotonic)
        for _ in range(5):
            await drain_with(slow, s, health, max_steps=3)
            await asyncio.sleep(0.01)
        await no_dead(slow)
        # Nothing counted or moved aside: the rows wait unread, and the timeouts were faults.
        assert await inbox_states(slow) == {"pending": 3}
        assert await slow.fetchval("SELECT count(*) FROM inbox_parked") == 0
        assert health.fault_streak >= 1
        await slow.execute("DROP TRIGGER slow ON inbound_messages")
        await drain_with(slow, s, health)
        assert await inbox_states(slow) == {"done": 3}
    finally:
        await slow.close()
