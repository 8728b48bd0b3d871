"""Two `gateway consume` processes on one inbox; one is SIGKILLed mid-batch again and again.

At the end every staged event has been processed exactly once: counted by its side effects.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sys
import time
from typing import Any

import asyncpg
import pytest

from gateway.core.events import InboundMessage, Status
from gateway.core.parsing import parse
from gateway.testing.payloads import message_obj, meta_payload, meta_value, status_obj, to_bytes
from tests.support.consume import add_outbox, inbox_states, lanes_held_by
from tests.support.handlers import TABLE

pytestmark = pytest.mark.slow

KILLS = 6
UNIQUE_PAYLOADS = 5000
DUPLICATE_SHARE = 0.2
OUTBOX_ROWS = 300


def workload(rng: random.Random) -> list[bytes]:
    """Payloads of 1-4 events (messages, statuses for outbox rows, group statuses), some redelivered."""
    bodies = []
    for i in range(UNIQUE_PAYLOADS):
        msgs = [message_obj(f"wamid.in{i}.{j}") for j in range(rng.randint(0, 2))]
        sts = []
        for _ in range(rng.randint(0, 2)):
            n = rng.randrange(OUTBOX_ROWS)
            status = rng.choice(["sent", "delivered", "read"])
            sts.append(status_obj(f"wamid.out{n}", status, callback=f"cb-{n}"))
        if rng.random() < 0.1:
            sts.append(status_obj(f"wamid.grp{i}", "read", participant=["p1", "p2", "p3"]))
        if not msgs and not sts:
            msgs = [message_obj(f"wamid.in{i}.x")]
        bodies.append(
            to_bytes(meta_payload(("messages", meta_value(messages=msgs or None, statuses=sts or None))))
        )
    bodies += rng.sample(bodies, int(len(bodies) * DUPLICATE_SHARE))
    rng.shuffle(bodies)
    return bodies


async def _ge(n: Any, want: int) -> bool:
    return bool(await n >= want)


def start(
    dsn: str, name: str, handlers: str = "", env: dict[str, str] | None = None
) -> asyncio.Future[asyncio.subprocess.Process]:
    env = {
        **(env or {}),
        "GATEWAY_HANDLERS": handlers,
        **os.environ,
        "DATABASE_URL": f"{dsn}{'&' if '?' in dsn else '?'}application_name={name}",
        "GATEWAY_MIGRATE_ON_START": "false",
        "GATEWAY_CONSUMER_CONCURRENCY": "1",
        "GATEWAY_CONSUMER_BATCH": "10",
        "GATEWAY_CONSUMER_POLL_MS": "50",
        "GATEWAY_RETRY_BASE_MS": "10",
        "GATEWAY_RETRY_MAX_MS": "50",
        "GATEWAY_LOG_LEVEL": "warning",
    }
    return asyncio.ensure_future(
        asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway", "consume", env=env, stdout=asyncio.subprocess.DEVNULL
        )
    )


async def backends(pool: asyncpg.Pool, name: str) -> int:
    n: int = await pool.fetchval("SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", name)
    return n


async def holds_claimed_rows(pool: asyncpg.Pool, name: str) -> bool:
    """True while the process is mid-batch: its transaction has locked rows (so it has an xid)."""
    n = await pool.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND backend_xid IS NOT NULL", name
    )
    return bool(n)


# Bounds on the test, not claims about speed: a process starting on a loaded machine is slow.
GIVE_UP_S = 60.0


async def wait_for(cond: Any, what: str, timeout_s: float = GIVE_UP_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not await cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.002)


@pytest.mark.parametrize("handlers", ["", "tests.support.handlers"])
async def test_sigkill_mid_batch_every_event_exactly_once(
    pool: asyncpg.Pool, db_dsn: str, handlers: str
) -> None:
    # With handlers, each call is recorded in the consumer's transaction (tests/support/handlers.py):
    # a call whose transaction a SIGKILL cut short leaves nothing, so each event shows once.
    await pool.execute(TABLE)
    rng = random.Random(7)
    for n in range(OUTBOX_ROWS):
        await add_outbox(pool, f"cb-{n}")
    bodies = workload(rng)
    expected: dict[str, Any] = {}
    for b in bodies:
        for ev in parse("meta", b):
            expected[ev.key] = ev
    n_msgs = sum(isinstance(e, InboundMessage) for e in expected.values())
    n_status = sum(isinstance(e, Status) for e in expected.values())

    # Half the backlog up front; the rest arrives in chunks while the victim keeps dying,
    # so every kill finds work in flight however fast the consumers are.
    first = len(bodies) // 2
    chunks = [bodies[:first]] + [bodies[first + i :: KILLS] for i in range(KILLS)]
    insert = "INSERT INTO webhook_inbox (source, body) VALUES ('meta', $1)"
    await pool.executemany(insert, [(b,) for b in chunks[0]])

    steady = await start(db_dsn, "crash-steady", handlers)
    victim = await start(db_dsn, "crash-victim", handlers)
    try:
        for chunk in chunks[1:]:
            await wait_for(lambda: _ge(backends(pool, "crash-victim"), 2), "the victim to connect")
            await pool.executemany(insert, [(b,) for b in chunk])
            await wait_for(lambda: holds_claimed_rows(pool, "crash-victim"), "the victim to claim a batch")
            await asyncio.sleep(rng.random() * 0.005)
            victim.send_signal(signal.SIGKILL)
            await victim.wait()
            victim = await start(db_dsn, "crash-victim", handlers)
        deadline = time.monotonic() + 2 * GIVE_UP_S
        while await pool.fetchval("SELECT count(*) FROM inbox_row_states() WHERE state <> 'done'"):
            assert time.monotonic() < deadline, await diagnose(pool)
            await asyncio.sleep(0.05)
    finally:
        for p in (steady, victim):
            if p.returncode is None:
                p.send_signal(signal.SIGTERM)
        for p in (steady, victim):
            await p.wait()
    assert await inbox_states(pool) == {"done": len(bodies)}
    keys = {r[0] for r in await pool.fetch("SELECT event_key FROM processed_webhook_events")}
    assert keys == set(expected)
    # Side effects, counted: each exactly once (message_statuses has no unique constraint).
    assert await pool.fetchval("SELECT count(*) FROM inbound_messages") == n_msgs
    assert await pool.fetchval("SELECT count(*) FROM message_statuses") == n_status
    assert await pool.fetchval("SELECT count(DISTINCT event_key) FROM message_statuses") == n_status
    # Every outbox row ends at the furthest status it was sent, whatever the order and the kills.
    rank = {"sent": 1, "delivered": 2, "read": 3}
    want: dict[str, str] = {}
    for e in expected.values():
        if (
            isinstance(e, Status)
            and e.callback_data
            and rank[e.status] > rank.get(want.get(e.callback_data, ""), 0)
        ):
            want[e.callback_data] = e.status
    rows = await pool.fetch(
        "SELECT callback_data, delivery_status FROM outbox WHERE delivery_status IS NOT NULL"
    )
    calls = await pool.fetch("SELECT event_key, count(*) AS n FROM handled GROUP BY event_key")
    if handlers:
        assert {r["event_key"]: r["n"] for r in calls} == dict.fromkeys(expected, 1)
    else:
        assert calls == []
    assert {r[0]: r[1] for r in rows} == want


async def test_sigstop_of_a_lane_owner_its_lanes_are_taken_over_and_it_doubles_nothing(
    pool: asyncpg.Pool, db_dsn: str
) -> None:
    """A consumer process that hangs (SIGSTOP) keeps its connections open, so it is not seen
    dead: its lanes are taken when their lease runs out. Woken again mid-batch, whatever it
    had read commits nothing (its cursors are no longer its own)."""
    rng = random.Random(11)
    bodies = workload(rng)[:1500]
    expected = {ev.key for b in bodies for ev in parse("meta", b)}
    for n in range(OUTBOX_ROWS):
        await add_outbox(pool, f"cb-{n}")
    insert = "INSERT INTO webhook_inbox (source, body) VALUES ('meta', $1)"
    lease = {"GATEWAY_CONSUMER_LANE_LEASE_S": "2"}
    steady = await start(db_dsn, "stop-steady", env=lease)
    victim = await start(db_dsn, "stop-victim", env=lease)
    try:
        await wait_for(lambda: _ge(backends(pool, "stop-victim"), 2), "the victim to connect")
        # Both own lanes (the victim half of them) before it hangs.
        await wait_for(lambda: lanes_held_by(pool, 2), "the lanes to be split between the two")
        await pool.executemany(insert, [(b,) for b in bodies[:750]])
        await wait_for(lambda: holds_claimed_rows(pool, "stop-victim"), "the victim to be mid-batch")
        victim.send_signal(signal.SIGSTOP)
        await pool.executemany(insert, [(b,) for b in bodies[750:]])
        # Everything is processed by the steady one once the victim's leases run out.
        deadline = time.monotonic() + GIVE_UP_S
        while await pool.fetchval("SELECT count(*) FROM inbox_row_states() WHERE state <> 'done'"):
            assert time.monotonic() < deadline, await diagnose(pool)
            await asyncio.sleep(0.05)
        victim.send_signal(signal.SIGCONT)
        await asyncio.sleep(3)  # it wakes up, finishes (fails) its batch, and rejoins
        await pool.executemany(insert, [(b,) for b in bodies[:100]])  # redeliveries, to both
        deadline = time.monotonic() + GIVE_UP_S
        while await pool.fetchval("SELECT count(*) FROM inbox_row_states() WHERE state <> 'done'"):
            assert time.monotonic() < deadline, await diagnose(pool)
            await asyncio.sleep(0.05)
    finally:
        for p in (steady, victim):
            if p.returncode is None:
                p.send_signal(signal.SIGCONT)
                p.send_signal(signal.SIGTERM)
        for p in (steady, victim):
            await p.wait()
    keys = {r[0] for r in await pool.fetch("SELECT event_key FROM processed_webhook_events")}
    assert keys == expected
    assert await pool.fetchval("SELECT count(DISTINCT wamid) FROM inbound_messages") == await pool.fetchval(
        "SELECT count(*) FROM inbound_messages"
    )
    assert await pool.fetchval("SELECT count(*) FROM message_statuses") == await pool.fetchval(
        "SELECT count(DISTINCT event_key) FROM message_statuses"
    )


async def diagnose(pool: asyncpg.Pool) -> str:
    """What a test that timed out waiting for the consumers shows: the rows' states, the
    lanes, and what each consumer's backend is doing."""
    lanes = await pool.fetch(
        "SELECT lane, owner, lease_until > now() AS leased, version, done_snap::text, win_snap::text"
        " FROM inbox_lanes ORDER BY lane"
    )
    activity = await pool.fetch(
        "SELECT application_name, state, wait_event_type, wait_event, backend_xid::text,"
        " now() - xact_start AS age, left(query, 80) AS query FROM pg_stat_activity"
        " WHERE application_name LIKE '%-%' ORDER BY application_name"
    )
    members = await pool.fetch("SELECT * FROM consumer_members")
    unread = await pool.fetch("SELECT lane, count(*) FROM inbox_unread() GROUP BY lane ORDER BY lane")
    return "\n".join(
        [str(await inbox_states(pool)), "unread per lane: " + str([tuple(r) for r in unread])]
        + [str(tuple(r)) for r in lanes]
        + [str(tuple(r)) for r in members]
        + [str(tuple(r)) for r in activity]
    )
