"""Migrations: applied once, safely concurrent, and leaving the schema sql/schema.sql shows;
each SQL function has one current source, sql/functions/<name>.sql, which `gateway migrate`
applies whenever its checksum differs from the one it applied last."""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest

from gateway.store.db import apply_functions, connect, latest_version, migrate, with_database
from gateway.store.sqlfiles import Function, functions, migrations, sql_dir
from gateway.testing.schemadump import REGENERATE, dump

SCHEMA = sql_dir() / "schema.sql"
# Released migrations keep the function bodies they shipped with. Any other migration must
# leave functions to sql/functions/ (its file would replace what the migration defined).
RELEASED = {
    "0001_webhook_inbox_and_outbox", "0002_processed_events_and_side_effects", "0003_idempotency_keys",
    "0004_dead_events_handlers", "0005_destinations_deliveries", "0006_send_pacing_breakers",
    "0007_partitions", "0008_reply_per_bot", "0009_subjects_and_lanes", "0010_destination_secret_rotation",
    "0011_delivery_leases", "0012_forwarding_storage", "0013_claims_due_from",
    "0014_customer_identities", "0015_media_and_number_routing", "0016_reply_guard_key_binding",
    "0018_operator_console",
}  # fmt: skip
DEFINES_FUNCTION = re.compile(r"CREATE\s+(?:OR\s+REPLACE\s+)?FUNCTION\s+(?!pg_temp\.)", re.IGNORECASE)


@pytest.fixture
async def empty_db(pg_admin_dsn: str) -> AsyncIterator[str]:
    name = f"gw_m_{uuid.uuid4().hex[:10]}"
    admin = await asyncpg.connect(pg_admin_dsn)
    await admin.execute(f'CREATE DATABASE "{name}"')
    yield with_database(pg_admin_dsn, name)
    await admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
    await admin.close()


async def test_concurrent_migrators_apply_each_migration_once(empty_db: str) -> None:
    conns = [await connect(empty_db) for _ in range(4)]
    try:
        results = await asyncio.gather(*(migrate(c) for c in conns))
        applied = sorted(v for r in results for v in r)
        # Every migration applied by exactly one of the four migrators: none twice, none missed.
        assert applied == [m.version for m in migrations()]
        versions = [r["version"] for r in await conns[0].fetch("SELECT version FROM schema_migrations")]
        assert sorted(versions) == applied
        assert max(versions) == latest_version()
        assert await migrate(conns[0]) == []  # idempotent
    finally:
        for c in conns:
            await c.close()


async def test_schema_sql_is_what_a_fresh_migration_leaves(empty_db: str) -> None:
    conn = await connect(empty_db)
    try:
        await migrate(conn)
    finally:
        await conn.close()
    actual = await dump(empty_db)
    assert actual == SCHEMA.read_text(), f"sql/schema.sql is stale: regenerate it with {REGENERATE}"


def test_no_unreleased_migration_defines_a_function() -> None:
    unreleased = [m for m in migrations() if f"{m.version:04d}_{m.name}" not in RELEASED]
    offenders = [m.name for m in unreleased if DEFINES_FUNCTION.search(m.sql)]
    assert offenders == [], "put the function's body in sql/functions/<name>.sql instead"


async def test_every_function_has_its_source_file_and_its_checksum(empty_db: str) -> None:
    conn = await connect(empty_db)
    try:
        await migrate(conn)
        names = await conn.fetch("SELECT proname FROM pg_proc WHERE pronamespace = 'public'::regnamespace")
        recorded = await conn.fetch("SELECT name, checksum FROM schema_functions")
    finally:
        await conn.close()
    assert {r["proname"] for r in names} == {f.name for f in functions()}
    assert {r["name"]: r["checksum"] for r in recorded} == {f.name: f.checksum for f in functions()}


async def test_an_older_database_gets_the_current_functions(empty_db: str) -> None:
    conn = await connect(empty_db)
    try:
        await migrate(conn, upto=13)  # not current: its functions are the migrations' own
        assert not await conn.fetchval("SELECT to_regclass('schema_functions') IS NOT NULL")
        # 0013's forward_round, whose rows were told apart by NULLs.
        args = await conn.fetchval("SELECT proargnames FROM pg_proc WHERE proname = 'forward_round'")
        assert "o_kind" not in args
        await migrate(conn)
    finally:
        await conn.close()
    assert await dump(empty_db) == SCHEMA.read_text()  # the schema of a fresh database, function bodies too


async def test_a_changed_source_is_applied_once_and_an_unchanged_one_never(pool: asyncpg.Pool) -> None:
    rank = next(f for f in functions() if f.name == "delivery_rank")
    played = "WHEN 'played' THEN 4"
    heard = Function(rank.name, rank.sql.replace(played, f"{played} WHEN 'heard' THEN 4"))
    assert heard.checksum != rank.checksum
    async with pool.acquire() as conn:
        assert await apply_functions(conn, functions()) == []  # the template is current
        assert await apply_functions(conn, [heard]) == ["delivery_rank"]
        assert await conn.fetchval("SELECT delivery_rank('heard')") == 4
        assert await apply_functions(conn, [heard]) == []
        assert await migrate(conn) == [] and await conn.fetchval("SELECT delivery_rank('heard')") == 0


async def test_a_database_that_woke_senders_by_trigger_loses_it(empty_db: str) -> None:
    """A database from before 0020 (its functions applied, outbox_notify among them) ends with
    no enqueue trigger, no function and no record of one: the current schema."""
    conn = await connect(empty_db)
    try:
        await migrate(conn, upto=19)
        # As `gateway migrate` left such a database: every function applied and recorded.
        await conn.execute("CREATE TABLE schema_functions (name text PRIMARY KEY, checksum text NOT NULL,"
                           " applied_at timestamptz NOT NULL DEFAULT now())")  # fmt: skip
        await conn.execute("INSERT INTO schema_functions (name, checksum) VALUES ('outbox_notify', 'old')")
        assert await conn.fetchval("SELECT count(*) FROM pg_trigger WHERE tgname = 'outbox_notify'") == 1
        assert await migrate(conn) == [v for v in range(20, latest_version() + 1)]
        trigger = await conn.fetchval("SELECT count(*) FROM pg_trigger WHERE tgname = 'outbox_notify'")
        recorded = await conn.fetchval("SELECT count(*) FROM schema_functions WHERE name = 'outbox_notify'")
    finally:
        await conn.close()
    assert (trigger, recorded) == (0, 0)
    assert await dump(empty_db) == SCHEMA.read_text()


async def test_migrate_citus_without_the_extension_is_refused_and_applies_nothing(db_dsn: str) -> None:
    from tests.support.procs import run_cli

    conn = await connect(db_dsn)
    try:
        applied = await conn.fetchval("SELECT count(*) FROM schema_migrations")
        env = {
            "PATH": "/usr/bin:/bin",
            "DATABASE_URL": db_dsn,
            "GATEWAY_META_APP_SECRETS": "meta-secret-migrate",
        }
        done = await asyncio.to_thread(run_cli, "migrate", "--citus", env=env)
        assert done.returncode == 1, done.stderr
        assert "--citus: this database has no citus extension" in done.stderr
        assert await conn.fetchval("SELECT count(*) FROM schema_migrations") == applied
    finally:
        await conn.close()
