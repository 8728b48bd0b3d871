"""The realistic send mix of ``bench-send --mix``: many customers, a fifth of them getting 2-5
messages each, in arrival order; and what is measured on what the fake provider received.

Pure helpers (the mix, the figures) and the phases that run a ``gateway send`` process on it.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg

from gateway.store import outbox
from gateway.store.listen import LISTENER_NAME
from gateway.testing.ports import free_port
from loadtest.harness import processes
from loadtest.harness.sql import q
from loadtest.harness.stats import percentile

TENANT = "bench"
# The latency phase's generator enqueues what is due this often.
TICK_S = 0.005
# Messages allowed to go and not yet sent, from which on the sender counts as saturated.
BACKLOG = 100
PAYLOAD = {"type": "text", "text": {"body": "bench"}}


def mix(messages: int, repeat_share: float, lo: int, hi: int, rng: random.Random) -> list[int]:
    """The customer of each message, in arrival order: customers get one message each, except
    ``repeat_share`` of them, who get ``lo``-``hi``; their messages are spread through the stream."""
    counts: list[int] = []
    while sum(counts) < messages:
        counts.append(rng.randint(lo, hi) if rng.random() < repeat_share else 1)
    counts[-1] -= sum(counts) - messages
    stream = [c for c, n in enumerate(counts) for _ in range(n)]
    rng.shuffle(stream)
    return stream


def inversions(order: Iterable[tuple[int, int]]) -> int:
    """Messages that reached the provider before an earlier one of their customer: ``order`` is
    (customer, position in the arrival stream) in the order the provider took them."""
    last: dict[int, int] = {}
    n = 0
    for customer, position in order:
        if position < last.get(customer, -1):
            n += 1
        last[customer] = max(position, last.get(customer, -1))
    return n


@dataclass(frozen=True, slots=True)
class Sent:
    customer: int
    arrival: float  # at the provider
    ready: float  # enqueued (0: with the backlog, before the sender started)


def due_times(sends: Sequence[Sent], pair_interval_s: float) -> list[tuple[float, bool]]:
    """When each message was allowed to go, and whether its pair interval held it back:
    ``sends`` in arrival order. From its enqueue (a backlog: the first arrival), or from its
    customer's previous arrival plus the pair interval if that is later."""
    start = min((m.arrival for m in sends), default=0.0)
    previous: dict[int, float] = {}
    due = []
    for m in sends:
        ready = max(start, m.ready)
        paced = previous.get(m.customer, float("-inf")) + pair_interval_s
        due.append((min(m.arrival, max(ready, paced)), paced > ready))
        previous[m.customer] = m.arrival
    return due


def backlog_rate(sends: Sequence[Sent], pair_interval_s: float, backlog: int) -> tuple[float, float]:
    """(sends/s, seconds) while the sender had a backlog: at least ``backlog`` messages allowed to
    go (``due_times``) and not yet at the provider. Time in which only pair waits remain, or a
    few messages trickle out as their waits end, is not the sender's throughput."""
    events = sorted(
        [(d, 1) for d, _held in due_times(sends, pair_interval_s)] + [(m.arrival, -1) for m in sends],
        key=lambda e: (e[0], -e[1]),
    )
    waiting, seconds, sent, last = 0, 0.0, 0, None
    for t, step in events:
        if last is not None and waiting >= backlog:
            seconds += t - last
        if step < 0 and waiting >= backlog:
            sent += 1
        waiting += step
        last = t
    return (sent / seconds if seconds > 0 else 0.0), seconds


def lateness_ms(sends: Sequence[Sent], pair_interval_s: float) -> list[float]:
    """For each message its pair interval held back: how long after the wait ended it arrived."""
    due = due_times(sends, pair_interval_s)
    return [(m.arrival - d) * 1000 for m, (d, held) in zip(sends, due, strict=True) if held]


@dataclass
class Env:
    """What the phases share: the scratch database, the fake provider, the sender's settings."""

    dsn: str
    pool: asyncpg.Pool
    fake_url: str
    log_dir: Path
    sender_env: dict[str, str]
    http: aiohttp.ClientSession


async def received(env: Env) -> list[dict[str, Any]]:
    async with env.http.get(f"{env.fake_url}/_fake/received") as r:
        got: list[dict[str, Any]] = await r.json(content_type=None)
        return got


async def start_sender(env: Env, name: str, pair_interval_s: float) -> processes.Proc:
    """``gateway send`` with the bench's settings and this pair interval, once it listens."""
    port = free_port()
    extra = {
        **env.sender_env,
        "GATEWAY_PAIR_INTERVAL_S": str(pair_interval_s),
        "GATEWAY_METRICS_PORT": str(port),
    }
    proc = processes.start_sender(env.dsn, env.log_dir, name, port, extra)
    try:
        await proc.wait_ready("/healthz")
        deadline = time.monotonic() + 30
        while not await env.pool.fetchval(q("lt_listeners"), LISTENER_NAME + "outbox"):
            if time.monotonic() > deadline or not proc.alive():
                raise RuntimeError(f"{name} never listened:\n{proc.log_tail()}")
            await asyncio.sleep(0.05)
    except BaseException:
        proc.stop()  # a bench that fails leaves no sender behind
        raise
    return proc


@dataclass
class Phase:
    """One run over the mix: what the provider received, per message of the phase."""

    name: str
    pair_interval_s: float
    customers: list[int]  # by position in the arrival stream
    got: list[dict[str, Any]]  # the fake's record of this phase's messages, in its order
    accepted: int
    seconds: float = 0.0  # how long the phase ran (enqueue or first send to the last send)
    enqueued: dict[int, float] = field(default_factory=dict)  # latency phase: each row's insert
    lag_ms: list[float] = field(default_factory=list)  # latency phase: scheduled -> enqueued
    scheduled_ms: dict[int, float] = field(default_factory=dict)  # latency phase: scheduled -> arrival

    def position(self, m: dict[str, Any]) -> int:
        return int(m["callback_data"].rsplit("-", 1)[1])

    def figures(self, backlog: int = BACKLOG) -> dict[str, Any]:
        stream = [(self.customers[self.position(m)], self.position(m), m["at"]) for m in self.got]
        sends = sorted((Sent(c, t, self.enqueued.get(p, 0.0)) for c, p, t in stream), key=lambda m: m.arrival)
        rate, busy = backlog_rate(sends, self.pair_interval_s, backlog)
        late = lateness_ms(sends, self.pair_interval_s) if self.pair_interval_s > 0 else []
        span = sends[-1].arrival - sends[0].arrival if len(sends) > 1 else 0.0
        dupes = len(self.got) - len({m["callback_data"] for m in self.got})
        return {
            "messages": len(self.customers),
            "customers": len(set(self.customers)),
            "received": len(self.got),
            "duplicates": dupes,
            "accepted": self.accepted,
            "sends_per_s": rate,
            "busy_s": busy,
            "span_s": span,
            "plain_sends_per_s": len(sends) / span if span > 0 else 0.0,
            "inversions": inversions((c, p) for c, p, _t in stream),
            "held_back": len(late),
            "held_back_late_p50_ms": percentile(late, 50),
            "held_back_late_p99_ms": percentile(late, 99),
        }


async def drain(env: Env, name: str, number: str, customers: list[int], pair_interval_s: float) -> Phase:
    """The whole mix enqueued at once (a backlog in arrival order), then one sender drains it."""
    keys = [f"{name}-{i}" for i in range(len(customers))]
    recipients = [f"49{c:011d}" for c in customers]
    await env.pool.execute(q("lt_outbox_enqueue_ordered"), TENANT, "meta", number, PAYLOAD, keys, recipients)
    sender = await start_sender(env, f"send-{name}", pair_interval_s)
    try:
        await _all_sent(env, sender, number, 600)
    finally:
        sender.stop()
    return await _phase(env, name, number, customers, pair_interval_s)


async def _all_sent(env: Env, sender: processes.Proc, number: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while await env.pool.fetchval(q("lt_outbox_unsent_number"), number):
        if time.monotonic() > deadline or not sender.alive():
            raise RuntimeError(f"{sender.name}: the mix was not all sent:\n{sender.log_tail()}")
        await asyncio.sleep(0.1)


async def _phase(env: Env, name: str, number: str, customers: list[int], pair_interval_s: float) -> Phase:
    prefix = f"{TENANT}:{name}-"
    got = [m for m in await received(env) if (m["callback_data"] or "").startswith(prefix)]
    async with env.http.delete(f"{env.fake_url}/_fake/received") as r:
        r.raise_for_status()  # each phase reads only its own record
    accepted = await env.pool.fetchval(q("lt_outbox_accepted_number"), number)
    return Phase(name, pair_interval_s, customers, got, accepted)


async def latency(
    env: Env, name: str, number: str, customers: list[int], rate: float, pair_interval_s: float
) -> tuple[Phase, dict[int, float]]:
    """The mix at ``rate`` messages/s (open model): every ``TICK_S`` the messages whose time has
    come are enqueued, in stream order, in one statement (one enqueue per message would make this
    process, not the sender, the limit on a shared machine). Returns the phase and each message's
    latency (ms, by position in the stream) from its row's insert (the database's clock) to its
    arrival at the provider."""
    sender = await start_sender(env, f"send-{name}", pair_interval_s)
    start = time.time() + 0.2
    scheduled = {i: start + i / rate for i in range(len(customers))}
    enqueued: dict[int, float] = {}
    try:
        i = 0
        while i < len(customers):
            await asyncio.sleep(max(0.0, min(scheduled[i] - time.time(), TICK_S)))
            now = time.time()
            batch = []
            while i < len(customers) and scheduled[i] <= now:
                batch.append(i)
                i += 1
            if not batch:
                continue
            async with env.pool.acquire() as conn:
                rows = await conn.fetch(
                    q("lt_outbox_enqueue_ordered"),
                    TENANT,
                    "meta",
                    number,
                    PAYLOAD,
                    [f"{name}-{j}" for j in batch],
                    [f"49{customers[j]:011d}" for j in batch],
                )
                # As the send front ends do after their commit (gateway.outbound.wake).
                await outbox.wake_senders(conn)
            # The database's time of the insert: the bench's own scheduling delays do not shift it.
            enqueued.update({int(r["idem_key"].rsplit("-", 1)[1]): r["at"] for r in rows})
        # The repeat customers' last messages wait their pair intervals.
        await _all_sent(env, sender, number, 60 + 5 * pair_interval_s)
    finally:
        sender.stop()
    phase = await _phase(env, name, number, customers, pair_interval_s)
    phase.seconds = len(customers) / rate
    phase.enqueued = enqueued
    phase.lag_ms = [(enqueued[i] - scheduled[i]) * 1000 for i in enqueued]
    phase.scheduled_ms = {
        phase.position(m): (m["at"] - scheduled[phase.position(m)]) * 1000 for m in phase.got
    }
    ms = {phase.position(m): (m["at"] - enqueued[phase.position(m)]) * 1000 for m in phase.got}
    return phase, ms


def first_message_latency(customers: list[int], ms: dict[int, float]) -> dict[str, float]:
    """p50/p99 of the latency of the messages of customers who got exactly one, and of the first
    message of the others."""
    count: dict[int, int] = {}
    for c in customers:
        count[c] = count.get(c, 0) + 1
    single = [ms[i] for i, c in enumerate(customers) if count[c] == 1 and i in ms]
    seen: set[int] = set()
    first_of_repeat = []
    for i, c in enumerate(customers):
        if count[c] > 1 and c not in seen and i in ms:
            first_of_repeat.append(ms[i])
        seen.add(c)
    return {
        "single_n": len(single),
        "single_p50_ms": percentile(single, 50),
        "single_p99_ms": percentile(single, 99),
        "single_max_ms": max(single, default=float("nan")),
        "repeat_first_p99_ms": percentile(first_of_repeat, 99),
    }
