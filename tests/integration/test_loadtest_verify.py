"""The post-run verification against a real database: a clean run passes; an injected loss, an
injected double and a stored bad signature each fail it."""

from __future__ import annotations

import asyncpg
import pytest
from aiohttp.test_utils import TestServer

from gateway.store.db import connect
from loadtest.harness import driver, plan, verify
from loadtest.harness.httpclient import Pool
from loadtest.harness.payloads import PayloadFactory, Secrets
from loadtest.harness.scenarios import scenario
from loadtest.harness.schedule import arrivals, constant
from loadtest.harness.stats import Ledger
from tests.support.config import META_SECRET, TENASHI_SECRET
from tests.support.consume import read_all

SECRETS = Secrets(meta=META_SECRET, tenashi=TENASHI_SECRET)
MIX = plan.Mix(immediate=0.1, delayed=0.1, concurrent=0.1, bad_signature=0.1, delay_s=0.3)


async def load(gateway: TestServer, seed: int = 1) -> tuple[Ledger, list[bytes]]:
    """A short open-model run through the real gateway: 120 requests in 1.5 s."""
    f = PayloadFactory(SECRETS, seed, run_tag=f"v{seed}")
    shots = list(plan.build(arrivals(constant(80, 1.5)), scenario("mixed", f), f, MIX, seed))
    ledger = Ledger()
    client = Pool("127.0.0.1", gateway.port, 32)
    try:
        res = await driver.run_open(shots, client, duration_s=1.5, ledger=ledger, progress=False)
    finally:
        client.close()
    assert res.recorder.outcomes["ok"] > 90 and res.recorder.outcomes["rejected_401"] > 0
    return ledger, [s.delivery.body for s in shots if not s.delivery.signed_ok]


def failed(v: verify.Verdict) -> set[str]:
    return {c.name for c in v.checks if not c.ok}


async def test_clean_run_passes_and_injected_faults_fail(
    gateway: TestServer, pool: asyncpg.Pool, db_dsn: str
) -> None:
    ledger, bad_bodies = await load(gateway)
    conn = await connect(db_dsn)
    try:
        v = await verify.verify(conn, ledger.entries, 0, consumers=False)
        assert v.ok, v.as_dict()
        redelivered = next(d for d, e in ledger.entries.items() if e.acked >= 2)
        once = next(d for d, e in ledger.entries.items() if e.sent == e.acked == 1)
        once_body = await conn.fetchval("SELECT body FROM webhook_inbox WHERE sha256(body) = $1", once)

        # Loss: one of a redelivered body's two acknowledged rows disappears.
        await conn.execute(
            "DELETE FROM webhook_inbox WHERE id = "
            "(SELECT min(id) FROM webhook_inbox WHERE sha256(body) = $1)",
            redelivered,
        )
        assert failed(await verify.verify(conn, ledger.entries, 0, consumers=False)) == {
            "ingest: every 200 stored"
        }

        # Double on top: a body sent once is stored twice.
        await conn.execute("INSERT INTO webhook_inbox (source, body) VALUES ('meta', $1)", once_body)
        assert failed(await verify.verify(conn, ledger.entries, 0, consumers=False)) == {
            "ingest: every 200 stored",
            "ingest: no extra rows",
        }

        # A badly signed body that got stored.
        await conn.execute("INSERT INTO webhook_inbox (source, body) VALUES ('meta', $1)", bad_bodies[0])
        assert "ingest: bad signatures not stored" in failed(
            await verify.verify(conn, ledger.entries, 0, consumers=False)
        )
    finally:
        await conn.close()


FAKE_CONSUMER_SCHEMA = """
CREATE SCHEMA lt_fake;
CREATE TABLE lt_fake.processed_webhook_events (
    event_key text PRIMARY KEY, inbox_id bigint NOT NULL, processed_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE lt_fake.inbound_messages (wamid text UNIQUE NOT NULL);
CREATE TABLE lt_fake.message_statuses (wamid text NOT NULL, status text NOT NULL, participant text NOT NULL);
"""


async def consume_as_a_consumer_would(conn: asyncpg.Connection, ledger: Ledger) -> None:
    """Stand-in for the consumers (another branch): keys and side effects, once each, in a schema
    of its own so the test holds whether or not the real tables exist."""
    await conn.execute(FAKE_CONSUMER_SCHEMA)
    await conn.execute("SET search_path = lt_fake, public")
    inbox_id = await conn.fetchval("SELECT max(id) FROM public.webhook_inbox")
    must_keys, _ = verify.expected_sets(ledger.entries)
    for key in sorted(must_keys):
        await conn.execute(
            "INSERT INTO processed_webhook_events (event_key, inbox_id) VALUES ($1, $2)", key, inbox_id
        )
        if key.startswith("msg:"):
            await conn.execute("INSERT INTO inbound_messages VALUES ($1)", key[4:])
        elif key.startswith("status:"):
            _, wamid, status, part = key.split(":", 3)
            await conn.execute("INSERT INTO message_statuses VALUES ($1, $2, $3)", wamid, status, part)
    await read_all(conn)


async def test_consumer_checks_catch_loss_and_double(gateway: TestServer, db_dsn: str) -> None:
    ledger, _ = await load(gateway, seed=2)
    conn = await connect(db_dsn)
    try:
        await consume_as_a_consumer_would(conn, ledger)
        v = await verify.verify(conn, ledger.entries, 0, drain_timeout_s=1)
        assert v.ok, v.as_dict()
        names = {c.name for c in v.checks}
        assert {"consumers: every event processed", "message_statuses: none doubled"} <= names
        assert v.e2e["count"] > 0

        # Loss: an event's key and side effect never committed.
        key = await conn.fetchval(
            "SELECT event_key FROM processed_webhook_events WHERE event_key LIKE 'msg:%' LIMIT 1"
        )
        await conn.execute("DELETE FROM processed_webhook_events WHERE event_key = $1", key)
        await conn.execute("DELETE FROM inbound_messages WHERE wamid = $1", key[4:])
        assert failed(await verify.verify(conn, ledger.entries, 0, drain_timeout_s=1)) == {
            "consumers: every event processed",
            "inbound_messages: none missing",
        }

        # Double: a status applied twice (a redelivery that slipped past dedup).
        await conn.execute("INSERT INTO message_statuses SELECT * FROM message_statuses LIMIT 1")
        assert "message_statuses: none doubled" in failed(
            await verify.verify(conn, ledger.entries, 0, drain_timeout_s=1)
        )

        # Undrained: a pending row fails the drain check.
        await conn.execute("INSERT INTO public.webhook_inbox (source, body) VALUES ('meta', '{}')")
        assert "consumers: inbox drained" in failed(
            await verify.verify(conn, ledger.entries, 0, drain_timeout_s=0.3)
        )
    finally:
        await conn.close()


@pytest.mark.parametrize(
    ("must", "may", "processed", "bad"),
    [
        ({"a", "b"}, {"a", "b", "c"}, {"a", "b"}, set()),
        ({"a", "b"}, {"a", "b", "c"}, {"a", "b", "c"}, set()),
        ({"a", "b"}, {"a", "b"}, {"a"}, {"consumers: every event processed"}),
        ({"a"}, {"a"}, {"a", "z"}, {"consumers: no unknown keys"}),
    ],
)
def test_compare_keys(must: set[str], may: set[str], processed: set[str], bad: set[str]) -> None:
    assert {c.name for c in verify.compare_keys(must, may, processed) if not c.ok} == bad
