"""The Graph-compatible wait over real HTTP against the fake Graph API: each request gets its
own wamid as soon as the sender has it, whichever process the sender runs in; a slow provider
ends the wait with the documented 202; and the enqueue's commit takes no part in PostgreSQL's
NOTIFY serialisation (the senders are woken after it)."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

import asyncpg
import orjson
import pytest
from aiohttp import ClientSession

from gateway.core.pacing import number_key
from gateway.core.settings import Settings
from gateway.outbound.outcomes import OutboxOutcome, OutcomeWaiter, running
from gateway.outbound.sender import Sender
from gateway.outbound.wake import SenderWake
from gateway.runtime import services
from gateway.store import outbox, pacing
from gateway.store.db import connect
from gateway.testing.fake_provider import FakeProvider
from gateway.testing.ports import closed_port
from gateway.web.app import GRAPH_API
from tests.support.graph import TO, graph, post, text
from tests.support.http import ACME
from tests.support.send import drain_sender, enqueue, send_settings

# The senders poll this seldom here: only a wake gets a send out within a test's patience.
NO_POLL_MS = 60_000


async def _many(http: ClientSession, gw: Any, n: int) -> list[tuple[int, dict[str, str], Any]]:
    """``n`` requests at once, each to its own recipient with its own body."""
    return await asyncio.gather(*(post(http, gw, text(to=_to(i), body=f"n{i}")) for i in range(n)))


def _to(i: int) -> str:
    return f"49151000{i:05d}"


@pytest.mark.parametrize("where", ["inline", "apart"])
async def test_concurrent_requests_each_get_their_own_wamid(
    where: str,
    http: ClientSession,
    start_gateway: Any,
    settings: Settings,
    pool: asyncpg.Pool,
    fake: FakeProvider,
) -> None:
    """40 requests at once, the sender in the gateway's process (woken directly) or in another
    one (woken by the NOTIFY sent after each commit); a poll too slow to matter either way."""
    inline = where == "inline"
    gw = await start_gateway(graph(settings, fake, run_sender=inline, send_poll_ms=NO_POLL_MS))
    apart = Sender(pool, send_settings(settings, fake, pair_interval_s=0.0, send_poll_ms=NO_POLL_MS))
    started = time.monotonic()
    if inline:
        answers = await _many(http, gw, 40)
    else:
        async with services.running(apart):
            await asyncio.sleep(0.3)  # listening
            answers = await _many(http, gw, 40)
    assert time.monotonic() - started < 10  # woken, never the 60 s poll
    ids = []
    for i, (status, _, body) in enumerate(answers):
        assert status == 200, body
        to = _to(i)
        [sent] = fake.received_by(to)  # each body sent once, to its own recipient
        assert sent.message["text"] == {"body": f"n{i}"}
        assert body == {"messaging_product": "whatsapp", "contacts": [{"input": to, "wa_id": to}],
                        "messages": [{"id": sent.id}]}  # fmt: skip
        ids.append(sent.id)
    assert len(set(ids)) == 40
    accepted = await pool.fetch("SELECT recipient, wamid FROM outbox WHERE state = 'accepted'")
    assert {r["wamid"]: r["recipient"] for r in accepted} == {
        body["messages"][0]["id"]: _to(i) for i, (_, _, body) in enumerate(answers)
    }


async def test_a_slow_provider_ends_the_wait_with_the_documented_202(
    http: ClientSession, start_gateway: Any, settings: Settings, pool: asyncpg.Pool, fake: FakeProvider
) -> None:
    """The provider answers after 1.5 s, the wait is 0.3 s: Meta's shape with the gateway's key
    and where the outcome will be; the send is not repeated, and the key then answers the wamid."""
    fake.add_fault("latency", to=TO, latency_ms=1500, times=2)
    s = graph(settings, fake, graph_compat_wait_ms=300, send_read_timeout_ms=5000, send_poll_ms=NO_POLL_MS)
    gw = await start_gateway(s)
    started = time.monotonic()
    status, headers, body = await post(http, gw, text(), key="slow-1")
    assert 0.25 < time.monotonic() - started < 1.4  # the wait's end, not the provider's answer
    assert status == 202, body
    assert body == {
        "messaging_product": "whatsapp",
        "contacts": [{"input": TO, "wa_id": TO}],
        "messages": [{"id": "slow-1"}],
        "gateway": {"key": "slow-1", "state": "sending", "location": "/v1/messages/slow-1"},
    }
    assert headers["Location"] == "/v1/messages/slow-1"
    async with asyncio.timeout(10):
        while (r := await outbox.get(pool, tenant="acme", key="slow-1")) is None or r["state"] != "accepted":
            await asyncio.sleep(0.05)
    [sent] = fake.received_by(TO)
    async with http.get(gw.make_url("/v1/messages/slow-1"), headers=ACME) as resp:
        assert (await resp.json())["wamid"] == sent.id
    status, headers, body = await post(http, gw, text(), key="slow-1")
    assert (status, body["messages"], headers.get("Idempotent-Replayed")) == (200, [{"id": sent.id}], "true")
    # Without a key the 202 names the gateway's own key, which reads the same way.
    status, headers, body = await post(http, gw, text())
    assert status == 202 and body["messages"][0]["id"] == body["gateway"]["key"]
    assert body["gateway"]["key"].startswith("graph.") and headers["Location"] == body["gateway"]["location"]
    async with asyncio.timeout(10):
        while len(fake.received_by(TO)) < 2:
            await asyncio.sleep(0.05)
    await asyncio.sleep(0.3)
    assert len(fake.received_by(TO)) == 2


async def test_the_send_api_wakes_a_sender_in_another_process(
    http: ClientSession, start_gateway: Any, settings: Settings, pool: asyncpg.Pool, fake: FakeProvider
) -> None:
    """POST /v1/messages in a process without a sender: its wake after the commit reaches a
    sender elsewhere within moments, not at its next poll."""
    gw = await start_gateway(graph(settings, fake, run_sender=False))
    apart = Sender(pool, send_settings(settings, fake, pair_interval_s=0.0, send_poll_ms=NO_POLL_MS))
    async with services.running(apart):
        await asyncio.sleep(0.3)  # listening
        for i in range(3):
            body = {"phone_number_id": "1111", "to": TO[:-1] + str(i), "type": "text", "text": {"body": "hi"}}
            headers = {**ACME, "Idempotency-Key": f"api-{i}"}
            async with http.post(gw.make_url("/v1/messages"), data=orjson.dumps(body), headers=headers) as r:
                assert r.status == 202, await r.text()
            async with asyncio.timeout(10):
                while not fake.received_by(TO[:-1] + str(i)):
                    await asyncio.sleep(0.01)


async def _heard(dsn: str, channel: str, action: Any) -> list[str]:
    """The NOTIFY payloads on ``channel`` while ``action()`` runs (and a moment after)."""
    heard: list[str] = []
    conn = await connect(dsn)
    try:
        await conn.add_listener(channel, lambda *a: heard.append(str(a[3])))
        await action()
        await asyncio.sleep(0.3)
    finally:
        await conn.close()
    return heard


async def test_an_enqueue_commits_without_a_notify_and_the_wake_follows_it(
    pool: asyncpg.Pool, db_dsn: str
) -> None:
    """A transaction that NOTIFYs holds PostgreSQL's database-wide NOTIFY lock through its
    commit's WAL flush: the enqueue's own commit stays out of it; the wake is a transaction
    of its own."""
    assert await _heard(db_dsn, "outbox", lambda: enqueue(pool, "quiet-1")) == []
    assert await _heard(db_dsn, "outbox", lambda: outbox.wake_senders(pool)) == [""]


async def test_only_the_states_that_end_a_wait_are_announced(
    pool: asyncpg.Pool, db_dsn: str, settings: Settings, fake: FakeProvider
) -> None:
    """The claim (pending -> sending) announces nothing: no one waits for it, and its
    transaction stays out of the NOTIFY lock; the outcome is announced once."""
    m = outbox.NewMessage("acme", "told-1", "meta", "1111", TO, {"type": "text", "text": {"body": "x"}},
                          notify_outcome=True)  # fmt: skip
    _, row = await outbox.enqueue(pool, m)
    sender = Sender(pool, send_settings(settings, fake, pair_interval_s=0.0))
    try:
        heard = await _heard(db_dsn, "outbox_outcome", lambda: drain_sender(sender))
    finally:
        await sender.close()
    [sent] = fake.received_by(TO)
    assert heard == [f"{row['id']} accepted {sent.id}"]


async def test_an_outcome_announced_before_the_request_waits_ends_its_wait_at_once(
    pool: asyncpg.Pool, settings: Settings, fake: FakeProvider
) -> None:
    """Under load the sender can finish a row before its request is back on the event loop to
    wait for it: the outcome heard meanwhile is its answer, not the last look a whole wait later."""
    waiter = OutcomeWaiter(settings)
    m = outbox.NewMessage("acme", "quick-1", "meta", "1111", TO, {"type": "text", "text": {"body": "x"}},
                          notify_outcome=True)  # fmt: skip
    sender = Sender(pool, send_settings(settings, fake, pair_interval_s=0.0))

    async def read() -> OutboxOutcome | None:
        r = await pool.fetchrow("SELECT state, wamid FROM outbox WHERE id = $1", row["id"])
        return None if r is None else OutboxOutcome(r["state"], r["wamid"])

    async with running(waiter):
        await waiter.ready()  # as a request does before it creates its row
        assert waiter.listening
        _, row = await outbox.enqueue(pool, m)
        try:
            await drain_sender(sender)  # accepted, announced: nobody waits yet
        finally:
            await sender.close()
        await asyncio.sleep(0.3)  # heard
        started = time.monotonic()
        outcome = await waiter.wait(row["id"], 5.0, read, OutboxOutcome(row["state"], row["wamid"]))
        assert time.monotonic() - started < 1.0
    [sent] = fake.received_by(TO)
    assert outcome == OutboxOutcome("accepted", sent.id)


async def test_a_row_another_claim_held_back_goes_once_that_claim_ends(
    pool: asyncpg.Pool, settings: Settings, fake: FakeProvider
) -> None:
    """A claim skips rows whose number another claim holds (never waits for it); the wake for
    them was spent on that skip, so the sender looks again soon, not at its next poll."""
    sender = Sender(pool, send_settings(settings, fake, pair_interval_s=0.0, send_poll_ms=NO_POLL_MS))
    async with services.running(sender), pool.acquire() as other:
        await asyncio.sleep(0.3)  # listening
        claim = other.transaction()
        await claim.start()
        await pacing.lock(other, [number_key("meta", "1111")])  # another sender's claim, under way
        callback = await enqueue(pool, "held-1")
        await outbox.wake_senders(pool)
        await asyncio.sleep(0.5)
        assert fake.count(callback) == 0  # skipped, not waited for
        await claim.commit()
        async with asyncio.timeout(5):  # not the 60 s poll
            while fake.count(callback) == 0:
                await asyncio.sleep(0.01)


async def test_wakes_of_concurrent_commits_share_notifies(
    db_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Commits before the NOTIFY leaves share it; those while it is under way share one more;
    a database that cannot be reached costs a warning, never the request."""
    wake = SenderWake(lambda: connect(db_dsn))

    async def commits() -> None:
        for _ in range(100):
            wake()
        await asyncio.sleep(0)  # the NOTIFY is under way
        for _ in range(100):
            wake()
        await wake.close()

    assert await _heard(db_dsn, "outbox", commits) == ["", ""]
    down = SenderWake(lambda: connect(f"postgresql://nobody@127.0.0.1:{closed_port()}/none", timeout=1))
    down()
    await down.close()
    assert "senders not woken (they poll)" in caplog.text


async def _outcome_listeners(pool: asyncpg.Pool) -> int:
    n: int = await pool.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'gateway LISTEN outbox_outcome'"
    )
    return n


async def test_the_outcome_listen_is_up_only_while_graph_requests_come(
    http: ClientSession, start_gateway: Any, settings: Settings, pool: asyncpg.Pool, fake: FakeProvider
) -> None:
    """A worker that answers no Graph-compatible request keeps no LISTEN (every NOTIFY of the
    database would wake it); the first request opens it and is answered its wamid at once, and
    it closes once no request has come for the idle time, to open again with the next one."""
    gw = await start_gateway(graph(settings, fake, send_poll_ms=NO_POLL_MS))
    waiter = gw.app[GRAPH_API].waiter
    waiter.idle_s = 1.0
    await asyncio.sleep(0.5)
    assert await _outcome_listeners(pool) == 0 and not waiter.listening
    for i in range(2):
        started = time.monotonic()
        status, _, body = await post(http, gw, text(to=_to(i), body=f"first {i}"))
        assert status == 200, body
        assert time.monotonic() - started < 2  # woken by the outcome, not the wait's last look
        assert await _outcome_listeners(pool) == 1
        async with asyncio.timeout(5):  # idle: closed
            while await _outcome_listeners(pool):
                await asyncio.sleep(0.1)
        assert not waiter.listening


async def test_a_request_goes_on_without_the_listen_when_the_database_cannot_be_reached(
    settings: Settings,
) -> None:
    """ready() waits for a try to open the LISTEN, not beyond: once it failed, requests go on at
    once (their own writes fail, or their wait's last look reads the row), and the waiter keeps
    trying in the background until stopped."""
    dead = dataclasses.replace(
        settings, database_url=f"postgresql://nobody@127.0.0.1:{closed_port()}/none", db_connect_timeout_s=0.5
    )
    waiter = OutcomeWaiter(dead)
    async with running(waiter):
        for bound in (1.5, 0.1):  # the try's failure, then at once
            started = time.monotonic()
            await waiter.ready(within=5.0)
            assert time.monotonic() - started < bound
            assert not waiter.listening
