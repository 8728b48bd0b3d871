"""Helpers for the forwarding tests: destinations, events through the real consumer, a
forwarder running against the fake receiver until a condition holds."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime

import asyncpg

from gateway.core.settings import Settings
from gateway.outbound.forwarder import Forwarder
from gateway.runtime import services
from gateway.store import deliveries
from gateway.testing.fake_receiver import FakeReceiver
from gateway.testing.payloads import message_obj, messages_payload, status_obj, statuses_payload, to_bytes
from tests.support.config import DESTINATION_SECRET, replace
from tests.support.consume import drain, stage


def fast(settings: Settings, **changes: object) -> Settings:
    """Settings with test-sized retries, timeouts and breaker cool-down."""
    base: dict[str, object] = {
        "forward_retry_base_ms": 20,
        "forward_retry_max_ms": 100,
        "forward_timeout_ms": 400,
        "forward_poll_ms": 50,
        "forward_breaker_failures": 5,
        "forward_breaker_cooldown_s": 0.3,
        "forward_concurrency": 32,
    }
    base.update(changes)
    return replace(settings, **base)


async def add(
    pool: asyncpg.Pool,
    name: str,
    url: str,
    events: tuple[str, ...] = ("message", "status", "account"),
    *,
    secret: str = DESTINATION_SECRET,
    max_in_flight: int = 16,
    ordered: bool = False,
) -> int:
    return await deliveries.add_destination(
        pool,
        name=name,
        url=url,
        events=list(events),
        secret=secret,
        max_in_flight=max_in_flight,
        ordered=ordered,
    )


async def process_messages(
    pool: asyncpg.Pool, settings: Settings, n: int, *, prefix: str = "wamid.F", customers: int = 5
) -> list[str]:
    """Stage ``n`` inbound messages (one payload each) and run the consumer; their keys."""
    keys = []
    for i in range(n):
        wamid = f"{prefix}{i}"
        sender = f"49151000000{i % customers:02d}"
        await stage(pool, to_bytes(messages_payload(message_obj(wamid, f"text {i}", sender=sender))))
        keys.append(f"msg:{wamid}")
    await drain(pool, settings)
    return keys


async def process_status(pool: asyncpg.Pool, settings: Settings, wamid: str, status: str) -> None:
    await stage(pool, to_bytes(statuses_payload(status_obj(wamid, status))))
    await drain(pool, settings)


@contextlib.asynccontextmanager
async def forwarding(pool: asyncpg.Pool, settings: Settings, n: int = 1) -> AsyncIterator[list[Forwarder]]:
    """``n`` forwarders running for the duration of the block, stopped (bounded) after it."""
    fws = [Forwarder(pool, settings) for _ in range(n)]
    async with services.running(*fws):
        yield fws


async def until(
    check: Callable[[], Awaitable[bool]], timeout_s: float = 20.0, what: str = "condition"
) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.03)


async def states(pool: asyncpg.Pool) -> dict[str, int]:
    """Deliveries per state as `gateway deliveries list` counts them (a held one is delivering)."""
    return await deliveries.count_deliveries(pool, destination=None, since=None, until=None)


def order_per_customer(receiver: FakeReceiver) -> dict[str, list[int]]:
    """Per customer, the numbers of its messages (wamid.F<n>) in the order the receiver got them."""
    out: dict[str, list[int]] = defaultdict(list)
    for msg_id in receiver.state.order:
        data = receiver.state.processed[msg_id]["data"]
        out[data["from"]].append(int(data["wamid"].removeprefix("wamid.F")))
    return out


async def all_delivered(pool: asyncpg.Pool) -> bool:
    s = await states(pool)
    return set(s) <= {"delivered"}


async def started_receiver(**kw: object) -> FakeReceiver:
    r = FakeReceiver(DESTINATION_SECRET, **kw)  # type: ignore[arg-type]
    await r.start()
    return r


async def queue_rebuilt(pool: asyncpg.Pool, dest: int, prefix: str, n: int) -> None:
    """n pending deliveries of small envelopes (msg:wamid.<prefix><i>), inserted directly."""
    rows = [
        {"key": f"msg:wamid.{prefix}{i}", "kind": "message", "conversation": "", "envelope": {"n": i},
         "received_at": datetime.now(UTC)}
        for i in range(n)
    ]  # fmt: skip
    await deliveries.insert_rebuilt(pool, destination_id=dest, rows=rows)
