"""The chaos run's bad inputs and forgotten sessions (``python -m loadtest chaos``).

Each round posts signed bodies that once stopped every consumer (``PayloadFactory.poisoned``:
odd digits for a timestamp, a message id too large for an index row, a change nested deeper
than the serialiser goes) and leaves a session idle in transaction, holding every partitioned
table, while the maintenance passes run (every few seconds in the run) with old partitions due
for a drop. Afterwards: the good events of the poisoned bodies were processed exactly once
(through the run's ledger, like every other body), each poisoned fragment is a dead item with
its bytes and nothing else is dead, and the old partitions were dropped once the session ended.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field

import asyncpg

from loadtest.harness import verify
from loadtest.harness.httpclient import Pool
from loadtest.harness.payloads import PayloadFactory
from loadtest.harness.sql import q
from loadtest.harness.stats import Ledger

# The partitioned tables a forgotten session holds (a SELECT on each, then nothing).
TABLES = (
    "processed_webhook_events",
    "webhook_inbox",
    "inbound_messages",
    "message_statuses",
    "account_errors",
    "account_updates",
)
# Old days, far behind every horizon (statuses and account records are kept 90 days by
# default): one per round is made just before the session opens.
OLD_DAYS_BACK = 1000


@dataclass
class Poison:
    """What the run's bad inputs must leave: per stored body (SHA-256), its dead items' kinds."""

    dead: dict[bytes, tuple[str, ...]] = field(default_factory=dict)
    sessions: int = 0
    notes: list[str] = field(default_factory=list)


async def send(pool: Pool, factory: PayloadFactory, ledger: Ledger, poison: Poison, give_up_s: float) -> None:
    """Post each poisoned body until it is acknowledged (the gateway may be restarting)."""
    for delivery, dead in factory.poisoned():
        deadline = time.monotonic() + give_up_s
        while True:
            digest = ledger.sent(delivery)
            poison.dead[digest] = dead
            try:
                status = await pool.request(delivery.wire)
            except Exception:  # the gateway is being killed: send the same bytes again
                status = None
            if status == 200:
                ledger.acked(digest)
                break
            if time.monotonic() > deadline:
                poison.notes.append(f"a poisoned body was not acknowledged ({status})")
                break
            await asyncio.sleep(0.5)


async def forget(dsn: str, hold_s: float, round_no: int, poison: Poison) -> None:
    """A session idle in transaction for ``hold_s``, holding every partitioned table, while a
    partition of each is due for a drop."""
    try:
        conn = await asyncpg.connect(dsn, timeout=5)
    except (OSError, asyncpg.PostgresError) as exc:
        poison.notes.append(f"round {round_no}: no forgotten session ({type(exc).__name__})")
        return
    try:
        day = OLD_DAYS_BACK + round_no
        for table in TABLES:
            await conn.fetchval(q("lt_old_partition"), table, day)
        await conn.execute("BEGIN")
        for table in TABLES:
            await conn.fetchval(f"SELECT count(*) FROM {table}")  # fixed names
        poison.sessions += 1
        await asyncio.sleep(hold_s)
        await conn.execute("ROLLBACK")
    except (OSError, asyncpg.PostgresError) as exc:
        poison.notes.append(f"round {round_no}: the forgotten session ended early ({type(exc).__name__})")
    finally:
        conn.terminate()


async def settle(conn: asyncpg.Connection, start_id: int, timeout_s: float) -> None:
    """Wait for the dead items still retrying and the old partitions' drops (the passes after
    the last session ended)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        retrying = await conn.fetchval(q("lt_dead_items_retrying"), start_id)
        old = await conn.fetchval(q("lt_old_partitions_left"), OLD_DAYS_BACK)
        if not retrying and not old:
            return
        await asyncio.sleep(0.5)


def checks(
    expected: dict[bytes, tuple[str, ...]], items: list[tuple[bytes, str, str]], old_left: int
) -> list[verify.Check]:
    """Pure: the dead items found (stored body's digest, kind, state) against what the poisoned
    bodies must leave; the old partitions left behind."""
    want: Counter[tuple[bytes, str]] = Counter()
    for digest, kinds in expected.items():
        want.update((digest, k) for k in kinds)
    got = Counter((d, kind) for d, kind, state in items if state == "dead" and d in expected)
    stray = [(d.hex()[:16], kind, state) for d, kind, state in items if d not in expected or state != "dead"]
    bodies = {d for d, _, _ in items}
    return [
        verify.Check(
            "poison: each poisoned fragment is a dead item, with its bytes",
            got == want,
            f"{sum(got.values())} dead of {sum(want.values())} expected",
            tuple(f"{d.hex()[:16]}:{k}" for d, k in (want - got)),
        ),
        verify.Check(
            "poison: nothing else is dead or still retrying",
            not stray,
            f"{len(stray)} other items in {len(bodies - set(expected))} bodies",
            tuple(str(s) for s in stray[:3]),
        ),
        verify.Check(
            "maintenance: old partitions dropped once the forgotten session ended",
            old_left == 0,
            f"{old_left} old partitions left",
        ),
    ]


async def verify_run(
    conn: asyncpg.Connection, start_id: int, poison: Poison, timeout_s: float
) -> list[verify.Check]:
    await settle(conn, start_id, timeout_s)
    items = [
        (bytes(r["digest"]), r["kind"], r["state"]) for r in await conn.fetch(q("lt_dead_items"), start_id)
    ]
    old_left = int(await conn.fetchval(q("lt_old_partitions_left"), OLD_DAYS_BACK))
    return checks(poison.dead, items, old_left)
