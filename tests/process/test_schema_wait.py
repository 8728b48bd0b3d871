"""Processes that do not migrate (GATEWAY_MIGRATE_ON_START=false, as in deploy/compose.yaml) wait
for `gateway migrate` to bring the schema to their version before they start, instead of running
on a schema they do not know or depending on the migration's container."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import asyncpg
import pytest

from gateway.store.db import MIGRATION_LOCK_ID, latest_version, migrate
from gateway.testing.scratch import scratch_database
from tests.support.procs import free_port, run_cli, spawn

# Bounds on the test, not claims about speed: a hang must fail, not block CI.
GIVE_UP_S = 60


@pytest.fixture
async def empty_dsn(pg_admin_dsn: str) -> AsyncIterator[str]:
    async with scratch_database(pg_admin_dsn, "gw_empty") as dsn:
        yield dsn


def base_env(dsn: str, wait_s: str) -> dict[str, str]:
    return {
        "PATH": "/usr/bin:/bin",
        "DATABASE_URL": dsn,
        "GATEWAY_MIGRATE_ON_START": "false",
        "GATEWAY_DB_WAIT_S": wait_s,
        "GATEWAY_META_APP_SECRETS": "meta-secret-schema-wait",
    }


async def status(url: str) -> int | None:
    try:
        async with aiohttp.ClientSession() as http, http.get(url) as r:
            return r.status
    except aiohttp.ClientError:
        return None


async def logged(log: Path, text: str) -> None:
    """Wait until ``log`` has ``text`` (a process starting on a loaded machine takes a while)."""
    async with asyncio.timeout(GIVE_UP_S):
        while text not in log.read_text():
            await asyncio.sleep(0.1)


async def test_serve_and_workers_wait_for_the_schema_then_start(empty_dsn: str, tmp_path: Path) -> None:
    env = base_env(empty_dsn, "60")
    web_port, consume_metrics = free_port(), free_port()
    serve_log, consume_log = tmp_path / "serve.log", tmp_path / "consume.log"
    serve = spawn(
        ["serve"],
        {
            **env,
            "GATEWAY_PORT": str(web_port),
            "GATEWAY_RUN_CONSUMERS": "0",
            "GATEWAY_RUN_SENDER": "0",
            "GATEWAY_RUN_FORWARDER": "0",
        },
        str(serve_log),
    )
    consume = spawn(["consume"], {**env, "GATEWAY_METRICS_PORT": str(consume_metrics)}, str(consume_log))
    ready = f"http://127.0.0.1:{web_port}/readyz"
    healthy = f"http://127.0.0.1:{consume_metrics}/healthz"
    try:
        # Before the migration: both wait, say why, and serve nothing (their health checks fail).
        await logged(serve_log, "waiting for `gateway migrate`")
        await logged(consume_log, "waiting for `gateway migrate`")
        await asyncio.sleep(1.0)
        assert serve.poll() is None and consume.poll() is None
        for log in (serve_log, consume_log):
            assert f"schema at version 0, this gateway needs {latest_version()}" in log.read_text()
        assert await status(ready) is None
        assert await status(healthy) is None

        done = run_cli("migrate", env=env)
        assert done.returncode == 0, done.stderr

        deadline = time.monotonic() + GIVE_UP_S
        while time.monotonic() < deadline:
            if await status(ready) == 200 and await status(healthy) == 200:
                break
            assert serve.poll() is None and consume.poll() is None
            await asyncio.sleep(0.1)
        assert await status(ready) == 200
        assert await status(healthy) == 200
        assert "starting" in consume_log.read_text()
    finally:
        for proc in (serve, consume):
            proc.terminate()
        codes = [proc.wait(timeout=30) for proc in (serve, consume)]
    assert codes == [0, 0]


async def test_a_schema_that_does_not_come_ends_in_one_line(empty_dsn: str) -> None:
    env = base_env(empty_dsn, "1")
    done = run_cli("consume", env=env)
    assert done.returncode == 3, done.stderr
    want = latest_version()
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .endswith(
            f"schema at version 0, this gateway needs {want} after waiting 1s (GATEWAY_DB_WAIT_S); "
            "run `gateway migrate`, or set GATEWAY_MIGRATE_ON_START=true"
        )
    )
    assert "Traceback" not in done.stderr
    # Half migrated (an older release's schema): the same, with its version.
    conn = await asyncpg.connect(empty_dsn)
    try:
        await migrate(conn, upto=5)
    finally:
        await conn.close()
    done = run_cli("serve", env=env)
    assert done.returncode == 3, done.stderr
    assert f"schema at version 5, this gateway needs {want} after waiting 1s" in done.stderr
    # The migration itself does not wait for the schema.
    done = run_cli("migrate", env=env)
    assert done.returncode == 0, done.stderr


async def test_a_running_migration_is_waited_for(db_dsn: str, tmp_path: Path) -> None:
    """`gateway migrate` applies the SQL functions after the last migration, under its lock: a
    schema at the right version is not ready while a migration run still holds that lock."""
    holder = await asyncpg.connect(db_dsn)
    consume_metrics = free_port()
    log = tmp_path / "consume.log"
    healthy = f"http://127.0.0.1:{consume_metrics}/healthz"
    try:
        assert await holder.fetchval("SELECT pg_try_advisory_lock($1)", MIGRATION_LOCK_ID)
        env = {**base_env(db_dsn, "60"), "GATEWAY_METRICS_PORT": str(consume_metrics)}
        consume = spawn(["consume"], env, str(log))
        try:
            await logged(log, "a migration still running")
            await asyncio.sleep(1.0)
            assert consume.poll() is None
            assert f"schema at version {latest_version()}, a migration still running" in log.read_text()
            assert await status(healthy) is None
            await holder.execute("SELECT pg_advisory_unlock($1)", MIGRATION_LOCK_ID)
            deadline = time.monotonic() + GIVE_UP_S
            while time.monotonic() < deadline:
                if await status(healthy) == 200:
                    break
                assert consume.poll() is None
                await asyncio.sleep(0.1)
            assert await status(healthy) == 200
        finally:
            consume.terminate()
            assert consume.wait(timeout=30) == 0
    finally:
        await holder.close()


async def test_a_sigterm_once_healthz_answers_is_a_graceful_stop(db_dsn: str, tmp_path: Path) -> None:
    """`gateway consume` answers /healthz before it has made its pool and migrated; a SIGTERM
    from then on ends it cleanly (exit 0), not by the signal's default action. Held inside that
    window here: it migrates on start, and the test holds the migration lock."""
    holder = await asyncpg.connect(db_dsn)
    port = free_port()
    log = tmp_path / "consume.log"
    try:
        assert await holder.fetchval("SELECT pg_try_advisory_lock($1)", MIGRATION_LOCK_ID)
        env = {**base_env(db_dsn, "60"), "GATEWAY_MIGRATE_ON_START": "true"}
        env["GATEWAY_METRICS_PORT"] = str(port)
        consume = spawn(["consume"], env, str(log))
        try:
            async with asyncio.timeout(GIVE_UP_S):
                while await status(f"http://127.0.0.1:{port}/healthz") != 200:
                    assert consume.poll() is None, log.read_text()
                    await asyncio.sleep(0.05)
            consume.terminate()
            await asyncio.sleep(0.5)
            await holder.execute("SELECT pg_advisory_unlock($1)", MIGRATION_LOCK_ID)
        finally:
            if consume.poll() is None:
                consume.terminate()
            code = await asyncio.to_thread(consume.wait, 30)
        assert code == 0, log.read_text()
    finally:
        await holder.close()
