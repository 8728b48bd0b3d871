"""Helpers for the send-side tests: a controllable clock, send settings against the fake
provider, enqueueing, reconciling."""

from __future__ import annotations

import time
from typing import Any

import asyncpg

from gateway.core.messages import callback_data
from gateway.core.settings import Settings
from gateway.maintenance import gauges
from gateway.maintenance.reconciler import Reconciler
from gateway.outbound.sender import Sender
from gateway.store import outbox
from gateway.testing.fake_provider import FakeProvider
from tests.support.config import replace
from tests.support.consume import drain

TO = "4915100000001"
WINDOW = 600


async def drain_sender(
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


async def send_everything(sender: Sender, clock: FakeClock, step_s: float = 0.25, rounds: int = 400) -> None:
    """Step, advancing the clock, until no row is pending or sending: a customer's messages go
    one after the other (one in flight per person), each a claim later."""
    for _ in range(rounds):
        await sender.step()
        if not await sender.pool.fetchval(
            "SELECT count(*) FROM outbox WHERE state IN ('pending', 'sending')"
        ):
            return
        clock.advance(step_s)
    raise AssertionError("rows still pending")


class FakeClock:
    """Epoch seconds that move only when a test says so.

    Starts a little ahead of the database clock so rows enqueued during the test are due.
    """

    def __init__(self, start: float | None = None) -> None:
        self.t = start if start is not None else time.time() + 5.0

    def now(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


def send_settings(settings: Settings, fake: FakeProvider, **changes: Any) -> Settings:
    base: dict[str, Any] = {
        "graph_url": fake.url + "/v21.0",
        "graph_token": "graph-token",
        "tenashi_url": fake.url,
        "tenashi_token": "tenashi-token",
        "send_connect_timeout_ms": 500,
        "send_read_timeout_ms": 300,
        "retry_base_ms": 1000,
        "retry_max_ms": 60000,
        "pair_interval_s": 6.0,
        "number_rate_per_s": 1000.0,
        "reconcile_window_s": 600,
        "send_batch": 50,
    }
    base.update(changes)
    return replace(settings, **base)


async def enqueue(
    pool: asyncpg.Pool,
    key: str,
    to: str = "4915100000001",
    *,
    tenant: str = "acme",
    provider: str = "meta",
    policy: str = "review",
    number: str = "1111",
) -> str:
    m = outbox.NewMessage(
        tenant=tenant,
        key=key,
        provider=provider,
        phone_number_id=number,
        recipient=to,
        payload={"type": "text", "text": {"body": f"hello {key}"}},
        unknown_policy=policy,
    )
    await outbox.enqueue(pool, m)
    return callback_data(tenant, key)


async def row(pool: asyncpg.Pool, key: str, tenant: str = "acme") -> asyncpg.Record:
    r = await outbox.get(pool, tenant=tenant, key=key)
    assert r is not None
    return r


async def apply_statuses_from_inbox(pool: asyncpg.Pool, settings: Settings) -> int:
    """Run the real consumer over the staged status webhooks; returns statuses recorded."""
    await drain(pool, settings)
    n: int = await pool.fetchval("SELECT count(*) FROM message_statuses")
    return n


async def reconcile(sender: Sender) -> dict[str, int]:
    """One maintenance pass of the send side (reconciler, then gauges) on the sender's clock."""
    counts = await Reconciler(sender.pool, sender.settings, clock=sender.clock).run_once()
    await gauges.refresh_outbox(sender.pool, now=sender.clock.now())
    return counts
