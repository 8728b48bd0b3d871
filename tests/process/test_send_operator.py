"""Operator commands of the send side, as real subprocesses: bulk release/cancel, senders."""

from __future__ import annotations

import asyncpg

from tests.support.procs import gateway_cli
from tests.support.send import enqueue, row


async def test_bulk_release_and_cancel(db_dsn: str, pool: asyncpg.Pool) -> None:
    for i in range(4):
        await enqueue(pool, f"f{i}", f"4915100000{i:03d}")
    await enqueue(pool, "g0", "4915100000100", tenant="globex")
    await enqueue(pool, "old", "4915100000101")
    await pool.execute("UPDATE outbox SET state = 'failed', updated_at = '2026-11-30T10:30:00Z'")
    await pool.execute("UPDATE outbox SET updated_at = '2026-11-29T10:30:00Z' WHERE idem_key = 'old'")
    await pool.execute("UPDATE outbox SET wamid = 'wamid.SENT' WHERE idem_key = 'f3'")

    code, out, err = await gateway_cli(
        db_dsn, "outbox", "release", "--state", "failed", "--since", "2026-11-30T10:00",
        "--until", "2026-11-30T11:00", "--tenant", "acme",
    )  # fmt: skip
    assert code == 0, err
    assert "3 row(s) released" in out and "1 row(s) not released" in out
    assert [(await row(pool, f"f{i}"))["state"] for i in range(4)] == ["pending"] * 3 + ["failed"]
    assert (await row(pool, "g0", "globex"))["state"] == "failed"  # other tenant
    assert (await row(pool, "old"))["state"] == "failed"  # before --since

    code, _, err = await gateway_cli(db_dsn, "outbox", "release", "f3")
    assert code == 1 and "wamid.SENT" in err and "twice" in err

    code, out, _ = await gateway_cli(db_dsn, "outbox", "cancel", "--state", "failed")
    assert code == 0 and "3 row(s) cancelled" in out
    assert (await row(pool, "f3"))["state"] == "cancelled"

    code, _, err = await gateway_cli(db_dsn, "outbox", "release", "f0", "--state", "failed")
    assert code == 2 and "not both" in err
    code, _, err = await gateway_cli(db_dsn, "outbox", "release", "--state", "pending")
    assert code == 1 and "only review, unknown or failed" in err


async def test_senders_list_and_resume(db_dsn: str, pool: asyncpg.Pool) -> None:
    await enqueue(pool, "held", "4915100000001")
    await pool.execute("UPDATE outbox SET next_attempt_at = now() + interval '1 hour'")
    await pool.execute(
        "INSERT INTO send_breakers (scope, provider, key, state, failures, code, error, retry_at)"
        " VALUES ('number', 'meta', '1111', 'open', 2, 368, 'blocked', extract(epoch FROM now()) + 3600)"
    )
    code, out, _ = await gateway_cli(db_dsn, "senders", "list")
    assert code == 0
    assert out.splitlines()[1].split("\t")[:6] == ["number", "meta", "1111", "open", "2", "368"]
    code, out, _ = await gateway_cli(db_dsn, "senders", "resume", "number", "1111")
    assert code == 0 and "closed" in out
    assert await pool.fetchval("SELECT state FROM send_breakers") == "closed"
    assert await pool.fetchval("SELECT next_attempt_at <= now() FROM outbox")  # due again
    code, _, err = await gateway_cli(db_dsn, "senders", "resume", "number", "1111")
    assert code == 1 and "not open" in err
