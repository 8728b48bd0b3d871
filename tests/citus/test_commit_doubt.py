"""The edge's promise on Citus when a worker is lost while a staging batch commits.

A batch writes one shard, and Citus commits such a transaction in one phase: the coordinator
sends the worker COMMIT, then commits itself. If the worker is lost during its COMMIT, Citus
only warns ("failed to commit transaction on host:port") and the statement succeeds, whether or
not the rows committed. Here the worker's COMMIT is held open by a deferred trigger that sleeps
on its shards and the worker is SIGKILLed meanwhile: the rows never committed, and the answer
must be 503 (it was 200 before the committer read that warning).

The send API's transaction is one shard's too; Citus fails that one itself (a transaction
block, not one statement whose rows went through the coordinator), which the second test holds.

Own cluster (a coordinator and one worker): the tests kill its worker."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from functools import partial

import asyncpg
import pytest
import pytest_asyncio
from aiohttp import ClientSession

from gateway.inbound.groupcommit import GroupCommitter, Unavailable
from gateway.runtime.services import gateway_app
from gateway.store.db import connect
from gateway.testing import citus
from gateway.web.server import listen
from loadtest.harness.database import citus_database
from tests.support.citus_db import own_cluster
from tests.support.config import gateway_settings
from tests.support.http import post_message

pytestmark = [pytest.mark.citus, pytest.mark.asyncio(loop_scope="module")]

# A trigger on each of the worker's own shards of a table, by a pattern of their names:
# webhook_inbox_p20261206_102008 (a day's partition's shard), outbox_102040.
_ON_SHARDS = """
DO $d$ DECLARE r record; BEGIN
  FOR r IN SELECT c.oid::regclass AS t FROM pg_class c
           WHERE c.relname ~ $p${shards}$p$ AND c.relkind = 'r' LOOP
    EXECUTE format('DROP TRIGGER IF EXISTS probe ON %s', r.t);
    EXECUTE format({create}, r.t);
  END LOOP;
END $d$;
"""
INBOX = "^webhook_inbox_p[0-9]+_[0-9]+$"
OUTBOX = "^outbox_[0-9]+$"


def slow_commit(shards: str) -> str:
    """The worker's COMMIT sleeps (a deferred trigger runs at COMMIT): a window to kill it in."""
    return _ON_SHARDS.format(
        shards=shards,
        create="'CREATE CONSTRAINT TRIGGER probe AFTER INSERT ON %s DEFERRABLE INITIALLY DEFERRED "
        "FOR EACH ROW EXECUTE FUNCTION probe_sleep()'",
    )


def no_probe(shards: str) -> str:
    return _ON_SHARDS.format(shards=shards, create="'SELECT %L'")


FUNCTIONS = """
CREATE OR REPLACE FUNCTION probe_sleep() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM pg_sleep(30); RETURN NULL; END $$;
"""


@pytest.fixture(scope="module")
def cluster(citus_cluster: citus.Cluster) -> Iterator[citus.Cluster]:
    with own_cluster(citus_cluster, "doubt", workers=1) as c:
        yield c


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def dsn(cluster: citus.Cluster) -> str:
    return await citus_database(cluster, "gw_doubt")


async def _on_worker(cluster: citus.Cluster, sql: str) -> None:
    conn = await citus.shard_session(cluster, "gw_doubt", cluster.workers[0], local_ddl=True)
    try:
        await conn.execute(FUNCTIONS + sql)
    finally:
        await conn.close()


@pytest_asyncio.fixture(loop_scope="module")
async def committer(dsn: str) -> AsyncIterator[GroupCommitter]:
    gc = GroupCommitter(partial(connect, dsn), window_s=0.001, max_inflight=1, deadline_s=60.0)
    # Its connection made and the statement prepared before any probe is in place.
    await asyncio.wait_for(gc.stage("meta", b'{"warm":1}'), 60)
    yield gc
    await gc.close()


async def _stored(dsn: str, body: bytes) -> int:
    conn = await asyncpg.connect(dsn, timeout=30)
    try:
        return int(await conn.fetchval("SELECT count(*) FROM webhook_inbox WHERE body = $1", body))
    finally:
        await conn.close()


async def _sleeping(dsn: str, timeout_s: float = 30) -> str:
    """Until a backend of the server at ``dsn`` sleeps in the trigger: the statement it runs."""
    conn = await asyncpg.connect(dsn, timeout=30)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            query = await conn.fetchval("SELECT query FROM pg_stat_activity WHERE wait_event = 'PgSleep'")
            if query is not None:
                return str(query)
            assert time.monotonic() < deadline, "the worker never reached the batch's COMMIT"
            await asyncio.sleep(0.05)
    finally:
        await conn.close()


async def test_worker_lost_during_its_commit_is_answered_503(
    cluster: citus.Cluster, dsn: str, committer: GroupCommitter
) -> None:
    await _on_worker(cluster, slow_commit(INBOX))
    body = b'{"lost":1}'
    fut = committer.stage("meta", body)
    # One phase: COMMIT, not PREPARE TRANSACTION (a two-phase commit fails at its PREPARE).
    assert await _sleeping(cluster.dsn("postgres", cluster.workers[0])) == "COMMIT"
    worker = cluster.workers[0]
    cluster.kill(worker)
    with pytest.raises(Unavailable):
        await asyncio.wait_for(fut, 60)
    await asyncio.to_thread(cluster.restart, worker)
    try:
        # The rows never committed: a 200 would have been a lost webhook.
        assert await _stored(dsn, body) == 0
    finally:
        await _on_worker(cluster, no_probe(INBOX))


async def test_a_send_whose_worker_is_lost_during_its_commit_is_answered_503(
    cluster: citus.Cluster, dsn: str
) -> None:
    """The send API's transaction (the outbox row and its Idempotency-Key's answer, one tenant's
    shard) commits in one phase too, but as a transaction block: there Citus checks the shard's
    connection after the COMMIT and raises ("could not commit transaction for shard ... on at
    least one active node"), so the answer is 503 without the committer's reading of warnings.
    A 202 here would be a send the client is told was accepted and that never happens."""
    s = gateway_settings(dsn)
    body = {"to": "4915112345678", "phone_number_id": "1111", "type": "text", "text": {"body": "hi"}}
    server = await listen(gateway_app(s), s, "127.0.0.1", 0)
    try:
        async with ClientSession() as http:
            status, _, answer = await post_message(http, server, body, key="warm")
            assert status == 202, answer
            await _on_worker(cluster, slow_commit(OUTBOX))
            worker = cluster.workers[0]
            sent = asyncio.ensure_future(post_message(http, server, body, key="lost-1"))
            assert await _sleeping(cluster.dsn("postgres", worker)) == "COMMIT"
            cluster.kill(worker)
            status, headers, answer = await asyncio.wait_for(sent, 60)
            assert status == 503 and headers["Retry-After"], answer
    finally:
        await server.close()
    await asyncio.to_thread(cluster.restart, worker)
    try:
        conn = await asyncpg.connect(dsn, timeout=30)
        try:
            assert await conn.fetchval("SELECT count(*) FROM outbox WHERE idem_key = 'lost-1'") == 0
        finally:
            await conn.close()
    finally:
        await _on_worker(cluster, no_probe(OUTBOX))
