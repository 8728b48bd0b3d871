"""Proof of routing: on a Citus cluster (GATEWAY_TEST_CITUS_DSN, a coordinator and two workers)
each hot statement of the gateway runs on one shard, or the test says why it does not.

"Router" here is read from the plan Citus prints (EXPLAIN: its custom scan with ``Task Count: 1``
and the statement's whole plan inside that one task), and, for writes, from
``pg_dist_transaction``: the coordinator records every two-phase commit there, so a write that
leaves no record committed on one node in one phase. The statements run with the gateway's own
store functions on a database distributed by ``gateway migrate --citus``.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from collections.abc import AsyncIterator
from functools import partial
from typing import Any

import asyncpg
import pytest
import pytest_asyncio

from gateway.core.planning import Plan
from gateway.inbound.groupcommit import GroupCommitter
from gateway.store import db, deliveries, idempotency, inbox, lanes, outbox, replies, retention
from gateway.store.sqlfiles import q
from gateway.testing import citus
from tests.support.citus_db import citus_dsn, drop_database, fresh_database

NAME = "gw_citus_routing"
# One distributed database for the module (distributing the schema takes seconds).
pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture(scope="module")
def cluster_db(citus_module_database: citus.ReusableDatabase) -> str:
    return citus_module_database.dsn


@pytest_asyncio.fixture(loop_scope="module")
async def conn(cluster_db: str) -> AsyncIterator[asyncpg.Connection]:
    c = await db.connect(cluster_db)
    try:
        yield c
    finally:
        await c.close()


async def plan(conn: asyncpg.Connection, sql: str, *args: Any) -> list[str]:
    return [r[0] for r in await conn.fetch("EXPLAIN (COSTS OFF) " + sql, *args)]


def routed(lines: list[str]) -> str:
    """The node the statement runs on whole: a Citus scan with one task and nothing planned on
    the coordinator around it (no distributed subplan: a CTE or subquery Citus could not push
    down would be one)."""
    text = "\n".join(lines)
    assert lines[0].startswith("Custom Scan (Citus Adaptive)"), text
    assert "Task Count: 1" in text and "Distributed Subplan" not in text, text
    (node,) = [ln.split("Node: ")[1] for ln in lines if "Node: " in ln]
    return node


async def two_phase_commits(conn: asyncpg.Connection) -> int:
    n: int = await conn.fetchval("SELECT count(*) FROM pg_dist_transaction")
    return n


async def lanes_of_one_shard(conn: asyncpg.Connection) -> list[int]:
    by_shard: dict[int, list[int]] = {}
    for lane, shard in (await lanes.shards(conn)).items():
        by_shard.setdefault(shard, []).append(lane)
    return max(by_shard.values(), key=len)


async def test_the_layout_is_applied_once_and_a_second_run_changes_nothing(cluster_db: str) -> None:
    conn = await db.connect(cluster_db)
    try:
        layout = "SELECT logicalrelid::text, partmethod::text, colocationid FROM pg_dist_partition ORDER BY 1"
        shards = "SELECT count(*) FROM pg_dist_shard"
        before = (await conn.fetch(layout), await conn.fetchval(shards))
        assert await db.migrate(conn, citus=True) == []
        assert await db.migrate(conn) == []  # once distributed, a plain migrate keeps the layout
        assert (await conn.fetch(layout), await conn.fetchval(shards)) == before
        kinds = {r["logicalrelid"]: (r["partmethod"], r["colocationid"]) for r in before[0]}
        # the groups of sql/citus/layout.sql
        assert kinds["webhook_inbox"][0] == "h" and kinds["inbox_lanes"] == kinds["webhook_inbox"]
        assert kinds["delivery_queue"] == kinds["webhook_inbox"] == kinds["delivery_events"]
        events = kinds["processed_webhook_events"]
        assert kinds["inbound_messages"] == events == kinds["reply_claims"] == kinds["message_statuses"]
        assert kinds["outbox"] == kinds["idempotency_keys"] == kinds["outbox_attempts"]
        assert kinds["destinations"][0] == "n" and "schema_migrations" not in kinds
        # the lanes of a shard share their `shard` number
        rows = await conn.fetch(
            "SELECT shard, array_agg(DISTINCT get_shard_id_for_distribution_column('webhook_inbox', lane))"
            " AS ids FROM inbox_lanes GROUP BY shard"
        )
        assert all(len(r["ids"]) == 1 for r in rows) and len(rows) > 1
    finally:
        await conn.close()


async def test_a_plain_migrate_of_an_undistributed_coordinator_is_refused(cluster_db: str) -> None:
    dsn = await fresh_database(citus_dsn(), NAME + "_plain")
    conn = await db.connect(dsn)
    try:
        with pytest.raises(db.CitusLayoutError, match="migrate --citus"):
            await db.migrate(conn)
        assert await conn.fetchval("SELECT to_regclass('webhook_inbox')") is None
    finally:
        await conn.close()
        await drop_database(citus_dsn(), NAME + "_plain")


async def test_staging_a_batch_writes_one_shard_in_one_phase_numbered_by_its_lane(
    conn: asyncpg.Connection,
) -> None:
    head = await conn.fetchval("SELECT seq FROM inbox_heads WHERE lane = 7")
    before = await two_phase_commits(conn)
    bodies = [f'{{"n": {i}}}'.encode() for i in range(5)]
    await inbox.insert_batch(conn, sources=["meta"] * 5, bodies=bodies, delivery_ids=[None] * 5, lane=7)
    assert await two_phase_commits(conn) == before
    rows = await conn.fetch(
        "SELECT id, lane, txid::text::bigint AS txid FROM webhook_inbox WHERE lane = 7 ORDER BY id"
    )
    assert [r["lane"] for r in rows] == [7] * 5
    # txid is the lane's own number, from its head on the same shard (the head's update is
    # the worker's own statement: still one shard, one phase), in the batch's order
    assert [r["txid"] for r in rows] == list(range(head + 1, head + 6))
    assert await conn.fetchval("SELECT seq FROM inbox_heads WHERE lane = 7") == head + 5


async def test_a_consumers_read_runs_whole_on_the_shard_of_its_lanes(conn: asyncpg.Connection) -> None:
    mine = await lanes_of_one_shard(conn)
    await inbox.insert_batch(conn, sources=["meta"], bodies=[b"{}"], delivery_ids=[None], lane=mine[0])
    cursors = await lanes.lease(conn, member="routing", lanes=mine, live=["routing"], ttl_s=30)
    assert sorted(c.lane for c in cursors) == sorted(mine)
    args = inbox.read_args(cursors, limit=100, max_bytes=1 << 20)
    lines = await plan(conn, q("inbox_read"), *args)
    node = routed(lines)
    # the lanes' heads (CTE heads) are read inside the worker's task, in the rows' snapshot
    task = "\n".join(lines[next(i for i, ln in enumerate(lines) if "Node: " in ln) :])
    assert "CTE heads" in task and "CTE a" in task, "\n".join(lines)
    async with conn.transaction():
        await inbox.read_mode(conn, idle_ms=5000)
        got = await inbox.read(conn, cursors, limit=100, max_bytes=1 << 20)
    assert [r.lane for r in got.rows] and {r.lane for r in got.rows} <= set(mine), node
    assert set(got.snapshots) == set(mine)
    assert all(got.snapshots[r.lane].xmax > r.txid for r in got.rows)
    await lanes.leave(conn, member="routing")


async def test_send_api_insert_and_lookups_are_router_queries(conn: asyncpg.Connection) -> None:
    args = ("acme", "route-1", "cb", "meta", "123", "456", json.dumps({"a": 1}), "review", "fp", None, False)
    routed(await plan(conn, q("outbox_enqueue"), *args))
    routed(await plan(conn, q("outbox_get"), "acme", "route-1"))
    routed(await plan(conn, q("idempotency_keys_get"), "acme", "route-1"))
    before = await two_phase_commits(conn)
    assert await idempotency.claim(conn, tenant="acme", key="route-1", fingerprint="fp", ttl_h=24, lease_s=30)
    assert not await idempotency.claim(
        conn, tenant="acme", key="route-1", fingerprint="fp", ttl_h=24, lease_s=30
    )
    assert await idempotency.get(conn, tenant="acme", key="route-1") is not None
    # The claim is an INSERT and an UPDATE in one statement: Citus runs each CTE as a subplan
    # (not one router query), each a single task on the one shard of the tenants' group, and
    # unites their results on the coordinator (its own node, "localhost"); one phase.
    lines = await plan(conn, q("idempotency_keys_claim"), "acme", "route-2", "fp", 24, 30.0)
    assert all(ln.strip() == "Task Count: 1" for ln in lines if "Task Count" in ln), "\n".join(lines)
    nodes = {ln.split("Node: ")[1] for ln in lines if "Node: " in ln and "host=localhost" not in ln}
    assert len(nodes) == 1, "\n".join(lines)
    assert await two_phase_commits(conn) == before


async def test_the_senders_claim_is_a_router_query(conn: asyncpg.Connection) -> None:
    lines = await plan(conn, q("outbox_claim_candidates"), 2e9, 10)
    routed(lines)
    assert "LockRows" in "\n".join(lines)  # FOR UPDATE SKIP LOCKED: Citus allows it on one shard only
    async with conn.transaction():
        assert await outbox.claim_candidates(conn, now=2e9, limit=10) is not None


async def test_a_reply_claim_touches_one_shard_in_one_phase(conn: asyncpg.Connection) -> None:
    # reply_claim is PL/pgSQL run on the coordinator (its advisory lock is the coordinator's);
    # each of its statements names the wamid, the distribution column of reply_claims.
    routed(await plan(conn, "SELECT 1 FROM reply_claims WHERE inbound_wamid = $1", "wamid.R"))
    before = await two_phase_commits(conn)
    first = await replies.claim(conn, inbound_wamid="wamid.R", bot="a", tenant="acme", key="k", per_bot=False)
    again = await replies.claim(
        conn, inbound_wamid="wamid.R", bot="b", tenant="acme", key="k2", per_bot=False
    )
    assert first is None and again is not None
    assert await two_phase_commits(conn) == before


async def test_the_consumers_batch_is_one_distributed_transaction(conn: asyncpg.Connection) -> None:
    # Not a router query by design: a batch's keys have many subjects (shards of the events
    # group) and its cursors are in the lanes group, so it is one distributed transaction,
    # committed in two phases. The one-statement form is refused by Citus ("correlated
    # subqueries are not supported when the FROM clause contains a CTE or subquery"); on Citus
    # the store runs the same batch as inbox_apply_batch_steps.
    day = dt.date(2026, 12, 4)
    keys = ["k:routing-1", "k:routing-2", "k:routing-3"]
    args = (keys, [1, 2, 3], "[]", "[]", "[]", "[]", [], [], "[]", [day] * 3, ["s-a", "s-b", "s-c"], "[]")
    with pytest.raises(asyncpg.FeatureNotSupportedError, match="correlated subqueries"):
        async with conn.transaction():
            await conn.fetch(q("inbox_apply_batch"), *args, None, None)
    before = await two_phase_commits(conn)
    plan = Plan(keys=keys, key_inbox=[1, 2, 3], key_days=[day] * 3, key_subjects=["s-a", "s-b", "s-c"])
    async with conn.transaction():
        applied = await inbox.apply_plan(conn, plan, citus=True)
    assert sorted(applied.fresh_keys) == keys
    shards = await conn.fetchval(
        "SELECT count(DISTINCT get_shard_id_for_distribution_column('processed_webhook_events', s))"
        " FROM unnest($1::text[]) s",
        ["s-a", "s-b", "s-c"],
    )
    assert shards > 1 and await two_phase_commits(conn) > before
    async with conn.transaction():
        again = await inbox.apply_plan(conn, plan, citus=True)
    assert again.fresh_keys == []


async def test_the_forwarder_round_runs_on_the_shard_of_its_lanes(conn: asyncpg.Connection) -> None:
    # A round names the lanes of one shard (the forwarder runs one per shard, gateway.outbound.
    # forwarder): every queue and event statement in it is planned on that shard (with the
    # round's values, sql/citus/layout.sql). Not one node in one phase: the forwarder's leases
    # and the destinations are reference tables (on every node), written by each round, so a
    # round is one distributed transaction (two-phase commit over every node) per round.
    mine = await lanes_of_one_shard(conn)
    shard_of = await lanes.shards(conn)
    other = next(lane for lane, s in shard_of.items() if s != shard_of[mine[0]])
    today = dt.date.today()
    for table in ("delivery_events", "delivery_log"):
        await retention.ensure_day(conn, table=table, day=today)
    dest = await deliveries.add_destination(
        conn, name="route", url="https://example.com/x", events=["message"],
        secret="whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", max_in_flight=10, ordered=True,
    )  # fmt: skip
    ids = {}
    for lane, key in ((mine[0], "a"), (mine[0], "b"), (other, "c")):
        ids[key] = await conn.fetchval(
            "INSERT INTO delivery_events (lane, received_at, event_key, kind, body)"
            " VALUES ($1, now(), $2, 'message', '{}') RETURNING id",
            lane,
            key,
        )
        # a and b are one customer's (conv 1): with ordering, b waits for a
        await conn.execute(
            "INSERT INTO delivery_queue (destination_id, event_id, received_at, event_day, lane, conv)"
            " VALUES ($1, $2, now(), current_date, $3, 1)",
            dest,
            ids[key],
            lane,
        )
    round_ = partial(
        deliveries.cycle,
        conn,
        forwarder="fw-route",
        threshold=5,
        lease_s=30,
        cooldown_s=30,
        housekeeping=True,
    )
    before = await two_phase_commits(conn)
    claimed, _, _ = await round_(results=[], breakers=[], limit=10, lanes=mine)
    assert [(c.id, c.lane, c.body) for c in claimed] == [(ids["a"], mine[0], b"{}")]
    # one prepared transaction per node (pg_dist_transaction has a row for each): the leases'
    # write reaches every node
    nodes = await conn.fetchval("SELECT count(DISTINCT groupid) FROM pg_dist_node")
    assert await two_phase_commits(conn) == before + nodes
    # its outcome, written in a round of its lane: a retry later, its attempt logged
    failed = deliveries.Result(dest, ids["a"], "pending", 60.0, 503, "busy")
    claimed, changes, _ = await round_(results=[failed], breakers=[(dest, False, 1)], limit=10, lanes=mine)
    assert claimed == [] and changes == []
    row = await conn.fetchrow("SELECT attempts, due > now() + interval '50 s' AS later FROM delivery_queue"
                              " WHERE event_id = $1", ids["a"])  # fmt: skip
    assert (row["attempts"], row["later"]) == (1, True)
    assert await conn.fetchval("SELECT count(*) FROM delivery_log WHERE event_id = $1", ids["a"]) == 1
    assert await conn.fetchval("SELECT consecutive_failures FROM destinations WHERE id = $1", dest) == 1
    # the other shard's delivery is claimed by a round of its own shard's lanes
    theirs = [lane for lane, s in shard_of.items() if s == shard_of[other]]
    claimed, _, _ = await round_(results=[], breakers=[], limit=10, lanes=theirs)
    assert [c.id for c in claimed] == [ids["c"]]
    # (deliveries.remove_destination's statement is refused on Citus: a correlated subquery)
    await conn.execute("DELETE FROM delivery_queue WHERE destination_id = $1", dest)
    await conn.execute("DELETE FROM delivery_leases WHERE destination_id = $1", dest)
    await conn.execute("DELETE FROM destinations WHERE id = $1", dest)


async def shards_on_workers(conn: asyncpg.Connection, partition: str) -> int:
    """How many shards of ``partition`` the workers hold (their own catalogs, asked on each)."""
    rows = await conn.fetch(
        "SELECT result FROM run_command_on_workers($$SELECT count(*) FROM pg_class"
        " WHERE relname ~ '^" + partition + "_[0-9]+$'$$)"
    )
    return sum(int(r["result"]) for r in rows)


@pytest.mark.parametrize("table", ["webhook_inbox", "processed_webhook_events", "delivery_log"])
async def test_day_partitions_are_made_and_dropped_on_every_shard(
    conn: asyncpg.Connection, table: str
) -> None:
    # The maintenance job's own statements through the coordinator: a partition made for a day
    # is distributed with its parent (colocated, every shard), and dropping the oldest drops it
    # on every worker (DETACH ... CONCURRENTLY is refused by Citus: a plain DETACH there).
    old = dt.date.today() - dt.timedelta(days=400)
    name = f"{table}_p{old:%Y%m%d}"
    assert await conn.fetchval(q("partition_ensure_day"), table, old)
    assert (
        await conn.fetchval("SELECT count(*) FROM pg_dist_shard WHERE logicalrelid = $1::regclass", name)
        == 32
    )
    assert await shards_on_workers(conn, name) == 32
    dropped = await retention.drop_oldest(conn, table=table, before=old + dt.timedelta(days=1), keep_days=7)
    assert dropped == name
    assert await conn.fetchval("SELECT to_regclass($1)", name) is None
    assert await shards_on_workers(conn, name) == 0


async def test_the_committer_wakes_the_consumers_from_the_coordinator(cluster_db: str) -> None:
    # No trigger NOTIFYs on Citus (sql/citus/layout.sql): the group committer does, after the
    # commit, on the coordinator where the consumers LISTEN; the batch stays one phase.
    heard: asyncio.Queue[str] = asyncio.Queue()
    listener = await db.connect(cluster_db)
    await listener.add_listener("webhook_inbox", lambda *a: heard.put_nowait(a[3]))
    gc = GroupCommitter(partial(db.connect, cluster_db), window_s=60.0, deadline_s=10.0)
    try:
        before = await two_phase_commits(listener)
        await asyncio.wait_for(gc.stage("meta", b'{"wake": 1}'), 10)
        assert await asyncio.wait_for(heard.get(), 5) == ""
        assert await two_phase_commits(listener) == before
    finally:
        await gc.close()
        await listener.close()
