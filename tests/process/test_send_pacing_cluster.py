"""Pacing holds across sender processes: three `gateway send` against one fake provider."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import sys
from collections import defaultdict

import asyncpg

from gateway.testing.fake_provider import FakeProvider
from tests.support.send import enqueue

PAIR_S = 3.0
RATE = 5.0  # per number per second; bursts of 5
# The fake stamps a message when it arrives, a little after the claim that paced it; on a
# loaded machine one request can lag another by this much.
ARRIVAL_JITTER_S = 1.0


async def spawn_sender(dsn: str, fake: FakeProvider, log_path: str) -> asyncio.subprocess.Process:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    env.update(
        {
            "DATABASE_URL": dsn,
            "GATEWAY_GRAPH_URL": fake.url + "/v21.0",
            "GATEWAY_GRAPH_TOKEN": "t",
            "GATEWAY_SEND_POLL_MS": "50",
            "GATEWAY_SEND_BATCH": "10",
            "GATEWAY_PAIR_INTERVAL_S": str(PAIR_S),
            "GATEWAY_NUMBER_RATE_PER_S": str(RATE),
            "GATEWAY_LOG_LEVEL": "warning",
        }
    )
    out = open(log_path, "wb")  # noqa: SIM115 - the child owns it
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "send", env=env, stdout=out, stderr=asyncio.subprocess.STDOUT
    )


async def test_three_senders_share_one_pace(
    db_dsn: str, pool: asyncpg.Pool, fake: FakeProvider, tmp_path: object
) -> None:
    procs = [await spawn_sender(db_dsn, fake, f"{tmp_path}/send-{i}.log") for i in range(3)]
    try:
        async with asyncio.timeout(30):  # all three listening
            while (
                await pool.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'gateway LISTEN outbox'"
                )
                < 3
            ):
                await asyncio.sleep(0.05)
        keys = []
        for i in range(5):  # five messages to each of three recipients, on number 1111
            for r in ("4915100000001", "4915100000002", "4915100000003"):
                keys.append(await enqueue(pool, f"pair-{r}-{i}", r))
        for i in range(20):  # and twenty to others, on 1111 and 2222
            keys.append(await enqueue(pool, f"spread-{i}", f"49152{i:08d}", number=("1111", "2222")[i % 2]))
        async with asyncio.timeout(60):
            while len(fake.received) < len(keys):
                await asyncio.sleep(0.05)
    finally:
        for p in procs:
            if p.returncode is None:
                p.send_signal(signal.SIGTERM)
        codes = [await asyncio.wait_for(p.wait(), 20) for p in procs]
    assert codes == [0, 0, 0]
    assert sorted(r.callback_data or "" for r in fake.received) == sorted(keys)  # each once

    # Arrivals at the provider, within the request jitter: no pair faster than its interval...
    arrivals: dict[tuple[str, str], list[float]] = defaultdict(list)
    by_number: dict[str, list[float]] = defaultdict(list)
    for r in fake.received:
        arrivals[(r.phone_number_id, r.to)].append(r.at)
        by_number[r.phone_number_id].append(r.at)
    for times in arrivals.values():
        times.sort()
        assert all(b - a >= PAIR_S - ARRIVAL_JITTER_S for a, b in itertools.pairwise(times))
    # ... no number above its rate: GCRA allows burst + rate x window in any window.
    window = 1.0
    for times in by_number.values():
        for t in times:
            assert sum(1 for u in times if t <= u < t + window) <= RATE + RATE * (window + ARRIVAL_JITTER_S)
    pairs_with_five = [t for t in arrivals.values() if len(t) == 5]
    assert len(pairs_with_five) == 3
    # Three senders without a shared pace would have sent these within a second or two.
    assert all(t[-1] - t[0] >= 4 * PAIR_S - ARRIVAL_JITTER_S for t in pairs_with_five)
