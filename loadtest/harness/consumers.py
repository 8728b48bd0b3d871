"""The production consumers draining a staged backlog, for the benchmarks that time
consumption (bench-consumers, bench-citus): the workload (a realistic mix of Meta webhooks),
staged as webhook_inbox rows; a ``ConsumerGroup`` (its lanes, its loops) run until nothing is
left to read; and the check that every event was processed exactly once."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from typing import Any

import asyncpg

from gateway.core.events import InboundMessage, Status
from gateway.core.parsing import parse
from gateway.core.settings import Settings
from gateway.inbound.consumer_group import ConsumerGroup
from gateway.store import inbox
from gateway.testing import payloads
from loadtest.harness.sql import q, queries

BASELINE = queries("baseline.sql")

# How often the drain looks whether anything is left.
POLL_S = 0.02


async def drain(pool: asyncpg.Pool, settings: Settings) -> None:
    """Run a consumer group over ``settings.database_url`` until every staged row is read and
    no webhook moved aside waits for a retry."""
    group = ConsumerGroup(pool, settings)
    stop = asyncio.Event()
    task = asyncio.create_task(group.run(stop))
    try:
        while not task.done():
            left = await pool.fetchval(q("drain_left"))
            if not left:
                break
            await asyncio.sleep(POLL_S)
    finally:
        stop.set()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await group.close()


def _meta(value: dict[str, Any]) -> bytes:
    return payloads.meta_bytes(payloads.meta_envelope([("waba-1", [("messages", value)])]))


def workload(
    events: int, redeliveries: float, rng: random.Random, now: float | None = None
) -> tuple[list[bytes], int]:
    """Staged bodies (one event each) and the number of outbox rows they update, stamped as
    Meta stamps them: the events' own times, seconds before they are staged (a key lives in
    the partition of its event's day)."""
    ts = int(time.time() if now is None else now) - 60
    outbox_rows = max(1, int(events * 0.75 / (1 + redeliveries)) // 3)
    n_messages = max(0, int(events / (1 + redeliveries)) - 3 * outbox_rows)
    bodies: list[bytes] = []
    for i in range(outbox_rows):
        for j, status in enumerate(("sent", "delivered", "read")):
            st = {
                "id": f"wamid.out{i}",
                "status": status,
                "timestamp": str(ts + j),
                "recipient_id": "4915112345678",
                "biz_opaque_callback_data": f"cb-{i}",
                "conversation": {"id": f"conv{i}", "origin": {"type": "utility"}},
                "pricing": {"billable": True, "pricing_model": "PMP", "category": "utility"},
            }
            bodies.append(_meta(payloads.meta_value(statuses=[st])))
    for i in range(n_messages):
        sender = f"49151{i % 997:07d}"
        msg = payloads.message_obj(f"wamid.in{i}", f"Hallo, Bestellung {i} bitte", sender, timestamp=str(ts))
        contacts = [{"profile": {"name": "Kunde"}, "wa_id": sender}]
        bodies.append(_meta(payloads.meta_value(messages=[msg], contacts=contacts)))
    rng.shuffle(bodies)
    bodies += rng.sample(bodies, int(len(bodies) * redeliveries))
    # Redeliveries arrive later, interleaved with the tail of the stream.
    tail = bodies[len(bodies) // 2 :]
    rng.shuffle(tail)
    bodies[len(bodies) // 2 :] = tail
    return bodies, outbox_rows


async def stage(pool: asyncpg.Pool, bodies: list[bytes], outbox_rows: int) -> None:
    async with pool.acquire() as conn:
        await conn.execute(BASELINE["naive_setup"])
        await conn.execute(BASELINE["bench_reset"])
        await conn.execute(BASELINE["bench_reset_outbox"])
        if not await conn.fetchval(BASELINE["bench_outbox_rows"]):
            await conn.execute(BASELINE["bench_seed_outbox"], outbox_rows)
        for i in range(0, len(bodies), 1000):
            chunk = bodies[i : i + 1000]
            await inbox.insert_batch(
                conn, sources=["meta"] * len(chunk), bodies=chunk, delivery_ids=[None] * len(chunk)
            )
        await conn.execute(BASELINE["naive_todo"])
        await conn.execute("VACUUM ANALYZE webhook_inbox")
        await conn.execute("VACUUM ANALYZE bench_naive_todo")
        await conn.execute("VACUUM ANALYZE outbox")


def expected(bodies: list[bytes], outbox_rows: int) -> dict[str, int]:
    """What ``check`` finds once the staged ``bodies`` are drained: every distinct event
    once, every outbox row read, nothing left unread."""
    unique = {ev.key: ev for b in bodies for ev in parse("meta", b)}
    return {
        "keys": len(unique),
        "messages": sum(isinstance(e, InboundMessage) for e in unique.values()),
        "statuses": sum(isinstance(e, Status) for e in unique.values()),
        "outbox_read": outbox_rows,
        "not_done": 0,
    }


async def check(pool: asyncpg.Pool) -> dict[str, int]:
    """The database's counts to compare with ``expected``."""
    row = await pool.fetchrow(BASELINE["bench_check"])
    assert row is not None
    return {k: int(v) for k, v in dict(row).items()}
