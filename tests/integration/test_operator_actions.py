"""The operators' actions (gateway.operator.actions): each does what the command line always did,
in one transaction with its audit entry; a refusal changes nothing and is recorded as refused."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from gateway.operator import actions
from gateway.operator.actions import Actor
from gateway.store import audit, deliveries
from tests.support.consume import dead_row
from tests.support.send import enqueue

pytestmark = pytest.mark.citus

ALICE = Actor("alice", "console")
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


async def entries(pool: asyncpg.Pool) -> list[audit.Entry]:
    return await audit.page(pool, before=None, actor=None, action=None, limit=100)


async def test_release_writes_its_entry_in_its_transaction(pool: asyncpg.Pool) -> None:
    await enqueue(pool, "order-42")
    await pool.execute("UPDATE outbox SET state = 'review'")
    async with pool.acquire() as conn:
        text = await actions.release(conn, ALICE, "order-42", window_s=600)
    assert "now pending" in text
    [e] = await entries(pool)
    assert (e.actor, e.via, e.action, e.target, e.rows) == (
        "alice",
        "console",
        "outbox.release",
        "order-42",
        1,
    )
    assert e.outcome == text


async def test_a_refused_release_changes_nothing_and_is_recorded_as_refused(pool: asyncpg.Pool) -> None:
    await enqueue(pool, "order-43")
    # The provider accepted it (a wamid): releasing would send it twice.
    await pool.execute("UPDATE outbox SET state = 'review', wamid = 'wamid.X'")
    async with pool.acquire() as conn:
        with pytest.raises(ValueError, match="would be sent twice"):
            await actions.release(conn, ALICE, "order-43", "acme", window_s=600)
    assert await pool.fetchval("SELECT state FROM outbox") == "review"
    [e] = await entries(pool)
    assert (e.action, e.target, e.rows) == ("outbox.release", "acme/order-43", 0)
    assert e.outcome.startswith("refused: ") and "sent twice" in e.outcome


async def test_an_action_that_fails_midway_leaves_no_entry_and_no_change(pool: asyncpg.Pool) -> None:
    await enqueue(pool, "order-44")
    await pool.execute("UPDATE outbox SET state = 'review'")
    async with pool.acquire() as conn:
        # The audit table refuses the entry: the release in the same transaction must go too.
        await conn.execute(
            "ALTER TABLE operator_actions ADD CONSTRAINT no_release CHECK (action <> 'outbox.release')"
        )
        try:
            with pytest.raises(asyncpg.CheckViolationError):
                await actions.release(conn, ALICE, "order-44", window_s=600)
        finally:  # a Citus run's database is reused by the next test (rows reset, not the schema)
            await conn.execute("ALTER TABLE operator_actions DROP CONSTRAINT no_release")
    assert await pool.fetchval("SELECT state FROM outbox") == "review"
    assert await entries(pool) == []


async def test_bulk_release_counts_done_and_refused(pool: asyncpg.Pool) -> None:
    for i in range(3):
        await enqueue(pool, f"b{i}")
    await pool.execute("UPDATE outbox SET state = 'failed'")
    await pool.execute("UPDATE outbox SET wamid = 'wamid.sent' WHERE idem_key = 'b0'")
    async with pool.acquire() as conn:
        done = await actions.outbox_bulk(
            conn, Actor("bob", "cli"), "release", state="failed", since=None, until=None, tenant=None,
            window_s=600,
        )  # fmt: skip
    assert (done.done, done.refused) == (2, 1)
    [e] = await entries(pool)
    assert (e.actor, e.via, e.action, e.rows) == ("bob", "cli", "outbox.release_bulk", 2)
    assert "1 row(s) not released" in e.outcome


async def test_cancel_one_and_in_bulk(pool: asyncpg.Pool) -> None:
    for key in ("c0", "c1", "c2", "c3"):
        await enqueue(pool, key)
    await pool.execute("UPDATE outbox SET state = 'review' WHERE idem_key <> 'c3'")
    await pool.execute("UPDATE outbox SET state = 'accepted' WHERE idem_key = 'c3'")
    async with pool.acquire() as conn:
        assert "now cancelled" in await actions.cancel(conn, ALICE, "c0")
        with pytest.raises(ValueError, match="is accepted: not cancelled"):
            await actions.cancel(conn, ALICE, "c3")
        done = await actions.outbox_bulk(
            conn, ALICE, "cancel", state="review", since=None, until=None, tenant="acme", window_s=600
        )
    assert done.done == 2
    states = dict(await pool.fetch("SELECT idem_key, state FROM outbox"))
    assert states == {"c0": "cancelled", "c1": "cancelled", "c2": "cancelled", "c3": "accepted"}
    assert [(e.action, e.rows) for e in await entries(pool)] == [
        ("outbox.cancel_bulk", 2),
        ("outbox.cancel", 0),
        ("outbox.cancel", 1),
    ]


async def test_dead_replay_by_range_and_by_id(pool: asyncpg.Pool) -> None:
    rid = await dead_row(pool, b"not json")
    async with pool.acquire() as conn:
        first = await actions.dead_replay(conn, ALICE, rows=[rid, rid + 100])
        again = await actions.dead_replay(
            conn, ALICE, every=True, since=datetime.now(UTC) - timedelta(hours=1), until=None
        )
        with pytest.raises(actions.Refused):
            await actions.dead_replay(conn, ALICE)  # neither ids nor a range
    assert (first.rows, first.missing) == ([rid], [f"R{rid + 100}"])
    assert again.rows == [] and again.items == []  # already replayed
    logged = await entries(pool)
    # A call that names nothing to act on is a usage error, not an action: no entry.
    assert [(e.action, e.rows) for e in logged] == [("dead.replay", 0), ("dead.replay", 1)]
    assert logged[1].target == f"R{rid} R{rid + 100}"


async def test_destination_actions_and_the_secret_never_logged(pool: asyncpg.Pool) -> None:
    await deliveries.add_destination(
        pool, name="crm", url="http://127.0.0.1:9/h", events=["message"], secret=SECRET,
        max_in_flight=4, ordered=False,
    )  # fmt: skip
    async with pool.acquire() as conn:
        assert await actions.set_enabled(conn, ALICE, "crm", enabled=False) == "disabled crm"
        rotated = await actions.rotate_secret(conn, ALICE, "crm", grace_h=1)
        with pytest.raises(actions.NotFound):
            await actions.set_enabled(conn, ALICE, "nope", enabled=True)
        with pytest.raises(actions.Refused):
            await actions.rotate_secret(conn, ALICE, "crm", secret="whsec_short")
        n = await actions.replay_deliveries(conn, ALICE, destination="crm", since=None, until=None)
    assert n == 0
    assert rotated.secret.startswith("whsec_") and rotated.secret != SECRET
    assert await pool.fetchval("SELECT secret FROM destinations") == rotated.secret
    logged = await entries(pool)
    assert [(e.action, e.rows) for e in logged] == [
        ("deliveries.replay", 0),
        # an invalid secret is a usage error (no entry); a missing destination a refusal
        ("destination.enable", 0),
        ("destination.rotate_secret", 1),
        ("destination.disable", 1),
    ]
    dump = await pool.fetchval("SELECT string_agg(operator_actions::text, ' ') FROM operator_actions")
    assert rotated.secret not in dump and SECRET not in dump and "whsec_short" not in dump


async def test_resume_a_breaker_that_is_not_open_is_refused(pool: asyncpg.Pool) -> None:
    async with pool.acquire() as conn:
        with pytest.raises(actions.Refused, match="not open"):
            await actions.resume_breaker(conn, ALICE, "number", "1111")
        await conn.execute(
            "INSERT INTO send_breakers (scope, provider, key, state, failures)"
            " VALUES ('number', 'meta', '1111', 'open', 3)"
        )
        assert "closed" in await actions.resume_breaker(conn, ALICE, "number", "1111")
    assert [(e.action, e.target, e.rows) for e in await entries(pool)] == [
        ("senders.resume", "number/meta/1111", 1),
        ("senders.resume", "number/meta/1111", 0),
    ]


@pytest.mark.parametrize("name", ["", "x" * 101, "tab\there"])
def test_an_actor_needs_a_printable_name(name: str) -> None:
    with pytest.raises(ValueError):
        Actor(name, "cli")
