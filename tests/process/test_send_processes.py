"""The send side as operators run it: `gateway serve` with the sender, `gateway send`, `gateway outbox`."""

from __future__ import annotations

import asyncio
import signal
from typing import Any

import asyncpg
from aiohttp import ClientSession

from gateway.core.settings import Settings
from gateway.testing.fake_provider import FakeProvider
from tests.support.http import ACME, post_message
from tests.support.procs import gateway_cli, spawn_send
from tests.support.send import enqueue, reconcile, row, send_settings


async def test_serve_runs_the_sender(
    http: ClientSession, start_gateway: Any, settings: Settings, pool: asyncpg.Pool, fake: FakeProvider
) -> None:
    s = send_settings(settings, fake, run_sender=True, send_poll_ms=20)
    gw = await start_gateway(s)
    body = {"to": "4915100000001", "phone_number_id": "1111", "type": "text", "text": {"body": "hi"}}
    assert (await post_message(http, gw, body, "e2e"))[0] == 202
    for _ in range(200):
        async with http.get(gw.make_url("/v1/messages/e2e"), headers=ACME) as r:
            got = await r.json()
        if got["state"] == "accepted":
            break
        await asyncio.sleep(0.05)
    assert got["state"] == "accepted" and got["wamid"] == fake.received[0].id
    assert len(fake.received) == 1


async def test_gateway_send_command(db_dsn: str, pool: asyncpg.Pool, fake: FakeProvider) -> None:
    callback = await enqueue(pool, "cli-send")
    proc = await spawn_send(db_dsn, fake)
    try:
        for _ in range(200):
            if (await row(pool, "cli-send"))["state"] == "accepted":
                break
            await asyncio.sleep(0.05)
        assert (await row(pool, "cli-send"))["state"] == "accepted"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 20) == 0
    assert fake.count(callback) == 1


async def test_outbox_commands(db_dsn: str, pool: asyncpg.Pool) -> None:
    await enqueue(pool, "rev-1")
    await enqueue(pool, "rev-2", "4915100000002")
    await enqueue(pool, "shared", tenant="acme")
    await enqueue(pool, "shared", tenant="globex")
    await pool.execute("UPDATE outbox SET state = 'review', last_error = 'read timeout'")

    code, out, _ = await gateway_cli(db_dsn, "outbox", "list", "--state", "review")
    assert code == 0
    lines = out.strip().splitlines()
    assert lines[0].startswith("tenant\tkey\tstate")
    assert sorted(line.split("\t")[1] for line in lines[1:]) == ["rev-1", "rev-2", "shared", "shared"]

    assert (await gateway_cli(db_dsn, "outbox", "release", "rev-1"))[0] == 0
    assert (await row(pool, "rev-1"))["state"] == "pending"
    assert (await gateway_cli(db_dsn, "outbox", "cancel", "rev-2"))[0] == 0
    assert (await row(pool, "rev-2"))["state"] == "cancelled"
    code, _, err = await gateway_cli(db_dsn, "outbox", "release", "rev-2")
    assert code == 1 and "cancelled" in err  # cancelled stays cancelled
    code, _, err = await gateway_cli(db_dsn, "outbox", "release", "shared")
    assert code == 2 and "--tenant" in err  # two tenants use the key
    assert (await gateway_cli(db_dsn, "outbox", "release", "shared", "--tenant", "globex"))[0] == 0
    assert (await row(pool, "shared", "globex"))["state"] == "pending"
    assert (await row(pool, "shared", "acme"))["state"] == "review"
    code, _, err = await gateway_cli(db_dsn, "outbox", "cancel", "missing")
    assert code == 1 and "no outbox row" in err


async def test_sender_killed_mid_batch_never_resends(
    db_dsn: str, pool: asyncpg.Pool, settings: Settings, fake: FakeProvider
) -> None:
    """SIGKILL `gateway send` while its requests are in flight: the rows become unknown, then
    review; nothing is sent twice."""
    from gateway.outbound.sender import Sender
    from tests.support.send import FakeClock

    n = 20
    callbacks = [await enqueue(pool, f"kill-{i}", f"49151{i:08d}") for i in range(n)]
    fake.add_fault("hang", times=n)  # accepted, and the answers never come
    proc = await spawn_send(db_dsn, fake)
    try:
        for _ in range(400):
            if len(fake.received) == n:
                break
            await asyncio.sleep(0.05)
        assert len(fake.received) == n
    finally:
        proc.kill()
        await proc.wait()
    assert await pool.fetchval("SELECT count(*) FROM outbox WHERE state = 'sending'") == n

    clock = FakeClock()
    sender = Sender(pool, send_settings(settings, fake), clock=clock)
    try:
        assert await sender.step() == 0  # 'sending' rows are not due: no blind resend
        clock.advance(sender.lease_s + 1)
        assert (await reconcile(sender))["expired_sending"] == n
        clock.advance(settings.reconcile_window_s + 1)
        assert (await reconcile(sender))["reconciled"] == n
        assert await sender.step() == 0
    finally:
        await sender.close()
    assert await pool.fetchval("SELECT count(*) FROM outbox WHERE state = 'review'") == n
    assert sorted(r.callback_data or "" for r in fake.received) == sorted(callbacks)  # each exactly once
