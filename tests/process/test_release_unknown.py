"""The issue's bad day, as operators would live it: `gateway send` is SIGKILLed while the provider
holds its request (it was delivered; the answer never came), the row becomes unknown, and an
operator runs `gateway outbox release` at once, well inside GATEWAY_RECONCILE_WINDOW_S and
before its status webhook has come. The release is refused, saying when it may go; the status
then settles the row, and the customer got one copy. Released with --i-know-it-may-duplicate,
it is sent again, and the audit log says the operator asked for that."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import asyncpg
from aiohttp import web

from gateway.core.settings import Settings
from gateway.outbound.sender import Sender
from gateway.store import outbox
from gateway.testing.fake_provider import FakeProvider
from tests.support.http import recorder
from tests.support.procs import gateway_cli, spawn_send
from tests.support.send import FakeClock, apply_statuses_from_inbox, drain_sender, enqueue, row, send_settings


async def test_an_unknown_send_released_early_is_refused_and_sent_once(
    db_dsn: str, pool: asyncpg.Pool, settings: Settings, fake: FakeProvider, start_gateway: Any
) -> None:
    gw = await start_gateway(settings)  # stages status webhooks (no consumers running)
    # The status webhooks the fake posts are kept back (Meta's can come minutes late) until the
    # test delivers them.
    async with recorder(lambda: web.Response(text="OK")) as (url, held):
        fake.config.webhook_url = url
        kept = await enqueue(pool, "refund-1", "4915100000001")
        forced = await enqueue(pool, "refund-2", "4915100000002")
        fake.add_fault("hang", times=2)  # delivered to the customer; the answer never comes
        proc = await spawn_send(db_dsn, fake)
        try:
            for _ in range(400):
                if len(fake.received) == 2:
                    break
                await asyncio.sleep(0.05)
            assert len(fake.received) == 2
        finally:
            proc.kill()  # SIGKILL mid-request
            await proc.wait()
        await fake.drain_webhooks()
    assert held, "the fake posted no status"
    assert await pool.fetchval("SELECT count(*) FROM outbox WHERE state = 'sending'") == 2
    # What a live sender's maintenance does once the dead one's lease is over.
    expired = await outbox.expire_sending(
        pool, now=time.time(), lease_s=0, limit=10, key_window_s=settings.tenashi_key_window_s
    )
    assert len(expired) == 2
    assert (await row(pool, "refund-1"))["state"] == "unknown"
    assert await pool.fetchval("SELECT count(*) FROM webhook_inbox") == 0  # no status came yet

    code, out, err = await gateway_cli(db_dsn, "outbox", "release", "refund-1")
    assert code == 1 and out == "" and len(err.splitlines()) == 1
    assert "acme/refund-1 is unknown since" in err and "may be released from" in err
    assert "--i-know-it-may-duplicate" in err
    code, out, _ = await gateway_cli(db_dsn, "outbox", "release", "--state", "unknown")
    assert code == 0 and "0 row(s) released" in out and "2 row(s) not released yet" in out
    assert "--i-know-it-may-duplicate" in out
    assert (await row(pool, "refund-1"))["state"] == "unknown"

    # refund-1's statuses come, inside the window (refund-2's never will).
    wamid = next(r.id for r in fake.received if r.callback_data == kept)
    async with aiohttp.ClientSession() as http:
        for posted in held:
            if wamid.encode() in posted.body:
                keep = ("content-type", "x-hub-signature-256")
                sent = {k: v for k, v in posted.headers.items() if k.lower() in keep}
                target = f"http://127.0.0.1:{gw.port}{posted.path}"
                async with http.post(target, data=posted.body, headers=sent) as r:
                    assert r.status == 200
    await apply_statuses_from_inbox(pool, settings)
    settled = await row(pool, "refund-1")
    assert settled["state"] == "accepted" and settled["wamid"] == wamid
    # No status will ever come for refund-2: the operator decides to send it again.
    code, out, _ = await gateway_cli(db_dsn, "outbox", "release", "refund-2", "--i-know-it-may-duplicate")
    assert code == 0 and "accepted that it may be sent twice" in out
    code, _, err = await gateway_cli(db_dsn, "outbox", "release", "refund-1", "--i-know-it-may-duplicate")
    assert code == 1 and "is accepted: not released" in err  # and never again, confirmation or not

    clock = FakeClock()  # moved past the pair pacing that the first attempts set
    sender = Sender(pool, send_settings(settings, fake), clock=clock)
    try:
        await drain_sender(sender, clock, step_s=10, rounds=10)
    finally:
        await sender.close()
    assert fake.count(kept) == 1  # one copy
    assert fake.count(forced) == 2  # what the operator accepted
    audit = await pool.fetch(
        "SELECT target, rows, params, outcome FROM operator_actions"
        " WHERE action = 'outbox.release' ORDER BY id"
    )
    assert [(a["target"], a["rows"]) for a in audit] == [("refund-1", 0), ("refund-2", 1), ("refund-1", 0)]
    assert audit[0]["outcome"].startswith("refused: ") and "may be released from" in audit[0]["outcome"]
    assert "may_duplicate" in audit[1]["params"] and "may be sent twice" in audit[1]["outcome"]
    assert "is accepted" in audit[2]["outcome"]
