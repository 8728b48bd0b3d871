"""Forwarding as operators run it: `gateway destinations`, `gateway deliveries`, `gateway forward`."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from datetime import timedelta

import asyncpg
import pytest

from gateway.core import stdwebhooks
from gateway.core.settings import Settings
from gateway.testing.fake_receiver import FakeReceiver
from tests.support import procs
from tests.support.config import DESTINATION_SECRET
from tests.support.forward import process_messages, states, until


async def gateway_cli(dsn: str, *args: str, allow_private: bool = True) -> tuple[int, str, str]:
    # The fake receivers listen on 127.0.0.1: private destinations allowed unless asked not to.
    env = {"GATEWAY_FORWARD_ALLOW_PRIVATE": "1" if allow_private else "0"}
    return await procs.gateway_cli(dsn, *args, env=env)


async def test_meta_format_destinations_from_the_command_line(db_dsn: str, pool: asyncpg.Pool) -> None:
    app_secret = "0f1e2d3c4b5a69788796a5b4c3d2e1f0"
    rc, out, err = await gateway_cli(
        db_dsn, "destinations", "add", "pywa", "http://127.0.0.1:9/", "--events", "message,status",
        "--format", "meta", "--secret", app_secret,
    )  # fmt: skip
    assert rc == 0 and "format=meta" in out and app_secret not in out + err, (out, err)
    row = await pool.fetchrow("SELECT format, secret FROM destinations WHERE name = 'pywa'")
    assert row is not None and (row["format"], row["secret"]) == ("meta", app_secret)
    rc, out, _ = await gateway_cli(db_dsn, "destinations", "list")
    assert rc == 0 and app_secret not in out and f"…{app_secret[-4:]}" in out
    assert out.rstrip().endswith("meta")
    # One signature: a grace period cannot be honoured, so the rotation is a switch.
    rotate = ("destinations", "rotate-secret", "pywa", "--secret", "next-secret-1")
    rc, _, err = await gateway_cli(db_dsn, *rotate)
    assert rc == 2 and "--grace-h 0" in err and "next-secret-1" not in err
    rc, out, _ = await gateway_cli(db_dsn, *rotate, "--grace-h", "0")
    assert rc == 0 and "next-secret-1" not in out
    assert await pool.fetchval("SELECT secret FROM destinations WHERE name = 'pywa'") == "next-secret-1"
    # A secret with spaces around it is refused (it would never verify), without being echoed.
    rc, _, err = await gateway_cli(
        db_dsn, "destinations", "add", "pywa2", "http://127.0.0.1:9/", "--events", "message",
        "--format", "meta", "--secret", " hunter2 ",
    )  # fmt: skip
    assert rc == 2 and "hunter2" not in err


@pytest.mark.citus
async def test_destinations_cli_validates_generates_and_masks_secrets(
    db_dsn: str, pool: asyncpg.Pool
) -> None:
    rc, out, err = await gateway_cli(
        db_dsn, "destinations", "add", "bot", "http://127.0.0.1:9/h", "--events", "message"
    )
    assert rc == 0, err
    generated = next(line.split(": ", 1)[1] for line in out.splitlines() if line.startswith("secret"))
    assert len(stdwebhooks.secret_key(generated)) == 32
    assert await pool.fetchval("SELECT secret FROM destinations WHERE name = 'bot'") == generated

    rc, out, err = await gateway_cli(
        db_dsn, "destinations", "add", "crm", "https://crm.example/wh", "--events", "status,account",
        "--secret", DESTINATION_SECRET, "--max-in-flight", "4", "--ordered",
    )  # fmt: skip
    assert rc == 0 and "secret" not in out, out

    for bad, why in (
        (["Bad", "http://x/", "--events", "message"], "name"),
        (["x", "ftp://x/", "--events", "message"], "http"),
        (["x", "http://x/", "--events", "orders"], "orders"),
        (["x", "http://x/", "--events", "message", "--secret", "whsec_c2hvcnQ="], "bytes"),
        (["x", "http://x/", "--events", "message", "--secret", "hunter2-hunter2"], "whsec_"),
    ):
        rc, out, err = await gateway_cli(db_dsn, "destinations", "add", *bad)
        assert rc == 2 and why in err, (bad, err)
        assert "hunter2" not in err
    rc, _out, err = await gateway_cli(
        db_dsn, "destinations", "add", "bot", "http://x/", "--events", "message"
    )
    assert rc == 1 and "exists" in err

    rc, out, _ = await gateway_cli(db_dsn, "destinations", "list")
    assert rc == 0
    assert generated not in out and DESTINATION_SECRET not in out and DESTINATION_SECRET[-4:] in out  # masked
    lines = out.splitlines()
    assert lines[1].startswith("bot\tTrue\tmessage") and lines[2].startswith(
        "crm\tTrue\taccount,status\tTrue\t4"
    )

    # Private destinations are refused unless allowed (the forwarder checks again at connect).
    for url, why in (
        ("http://127.0.0.1:8080/h", "loopback"),
        ("http://localhost/h", "loopback"),
        ("http://169.254.169.254/latest/meta-data/", "link-local"),
        ("http://10.1.2.3/h", "private"),
        ("http://[::ffff:192.168.0.1]/h", "private"),
    ):
        rc, _, err = await gateway_cli(
            db_dsn, "destinations", "add", "inside", url, "--events", "message", allow_private=False
        )
        assert rc == 2 and why in err and "GATEWAY_FORWARD_ALLOW_PRIVATE" in err, (url, err)
    assert await pool.fetchval("SELECT count(*) FROM destinations WHERE name = 'inside'") == 0

    # Rotation: a new secret (generated, shown once), the old one valid for the grace period.
    rc, out, _ = await gateway_cli(db_dsn, "destinations", "rotate-secret", "crm", "--grace-h", "2")
    assert rc == 0 and "valid until" in out
    rotated = out.split("receiver): ")[1].strip()
    stdwebhooks.secret_key(rotated)
    row = await pool.fetchrow(
        "SELECT secret, previous_secret, previous_secret_until - clock_timestamp() AS left"
        " FROM destinations WHERE name = 'crm'"
    )
    assert row is not None and (row["secret"], row["previous_secret"]) == (rotated, DESTINATION_SECRET)
    assert timedelta(hours=1, minutes=59) < row["left"] <= timedelta(hours=2)
    rc, out, _ = await gateway_cli(db_dsn, "destinations", "list")
    assert rc == 0 and rotated not in out and DESTINATION_SECRET not in out
    assert f"{rotated[-4:]} (and whsec_…{DESTINATION_SECRET[-4:]} until " in out
    assert (await gateway_cli(db_dsn, "destinations", "rotate-secret", "nope"))[0] == 1
    rc, _, err = await gateway_cli(db_dsn, "destinations", "rotate-secret", "crm", "--secret", "whsec_x")
    assert rc == 2 and "whsec_x" not in err

    assert (await gateway_cli(db_dsn, "destinations", "disable", "crm"))[0] == 0
    assert await pool.fetchval("SELECT enabled FROM destinations WHERE name = 'crm'") is False
    assert (await gateway_cli(db_dsn, "destinations", "enable", "crm"))[0] == 0
    assert (await gateway_cli(db_dsn, "destinations", "remove", "crm"))[0] == 0
    assert (await gateway_cli(db_dsn, "destinations", "remove", "crm"))[0] == 1
    assert await pool.fetchval("SELECT count(*) FROM destinations") == 1


async def test_gateway_forward_process_delivers_and_deliveries_cli_replays(
    db_dsn: str, pool: asyncpg.Pool, settings: Settings
) -> None:
    receiver = FakeReceiver(DESTINATION_SECRET)
    url = await receiver.start()
    proc: asyncio.subprocess.Process | None = None
    try:
        rc, _, err = await gateway_cli(
            db_dsn, "destinations", "add", "crm", url, "--events", "message", "--secret", DESTINATION_SECRET
        )
        assert rc == 0, err
        keys = await process_messages(pool, settings, 5)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway", "forward",
            env={**os.environ, "DATABASE_URL": db_dsn, "GATEWAY_LOG_LEVEL": "warning",
                 "GATEWAY_FORWARD_POLL_MS": "100", "GATEWAY_FORWARD_ALLOW_PRIVATE": "1"},
        )  # fmt: skip
        assert await receiver.wait_for(5, 30)
        assert set(receiver.state.processed) == {stdwebhooks.webhook_id("crm", k) for k in keys}
        await until(lambda: _delivered(pool, 5), what="recorded as delivered")

        rc, out, _ = await gateway_cli(
            db_dsn, "deliveries", "list", "--destination", "crm", "--state", "delivered"
        )
        assert rc == 0 and out.strip().splitlines()[-1] == "totals: delivered=5"
        # Replay the delivered ones: the receiver sees the same webhook ids again and dedups.
        rc, out, _ = await gateway_cli(
            db_dsn, "deliveries", "replay", "--destination", "crm", "--state", "delivered",
            "--since", "2000-01-01T00:00:00", "--until", "2999-01-01T00:00:00+00:00",
        )  # fmt: skip
        assert rc == 0 and "replayed 5" in out
        await until(lambda: _attempts(receiver, 10), what="replayed deliveries")
        await until(lambda: _delivered(pool, 5), what="delivered again")
        assert sum(receiver.state.duplicates.values()) == 5 and len(receiver.state.processed) == 5

        rc, out, err = await gateway_cli(db_dsn, "deliveries", "backfill", "--destination", "crm",
                                         "--since", "2000-01-01", "--until", "2999-01-01")  # fmt: skip
        assert rc == 0 and "backfilled 0 deliveries from 5 events" in out, (out, err)
        rc, _, err = await gateway_cli(db_dsn, "deliveries", "backfill", "--destination", "nope",
                                       "--since", "2000-01-01", "--until", "2999-01-01")  # fmt: skip
        assert rc == 1 and "nope" in err
    finally:
        if proc is not None and proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(proc.wait(), 20) == 0
        await receiver.close()


async def _delivered(pool: asyncpg.Pool, n: int) -> bool:
    return await states(pool) == {"delivered": n}


async def _attempts(receiver: FakeReceiver, n: int) -> bool:
    return len(receiver.state.attempts) >= n


def _forward_proc_env(dsn: str) -> dict[str, str]:
    return {
        **os.environ, "DATABASE_URL": dsn, "GATEWAY_LOG_LEVEL": "warning",
        "GATEWAY_FORWARD_POLL_MS": "100", "GATEWAY_FORWARD_ALLOW_PRIVATE": "1",
        "GATEWAY_FORWARD_CONCURRENCY": "4", "GATEWAY_FORWARD_BATCH": "8", "GATEWAY_FORWARD_LEASE_S": "2",
    }  # fmt: skip


async def _held(pool: asyncpg.Pool) -> int:
    n: int = await pool.fetchval("SELECT coalesce(sum(cardinality(ids)), 0) FROM delivery_leases")
    return n


async def test_a_forwarder_killed_mid_batch_loses_nothing_and_its_claims_are_sent_once_more(
    db_dsn: str, pool: asyncpg.Pool, settings: Settings
) -> None:
    # Slow answers, so that the forwarder holds requests in flight and a queue when it dies.
    receiver = FakeReceiver(DESTINATION_SECRET, latency_ms=300)
    url = await receiver.start()
    procs: list[asyncio.subprocess.Process] = []
    try:
        rc, _, err = await gateway_cli(
            db_dsn, "destinations", "add", "crm", url, "--events", "message", "--secret", DESTINATION_SECRET,
            "--max-in-flight", "12",
        )  # fmt: skip
        assert rc == 0, err
        keys = await process_messages(pool, settings, 30)
        env = _forward_proc_env(db_dsn)
        procs.append(
            await asyncio.create_subprocess_exec(sys.executable, "-m", "gateway", "forward", env=env)
        )
        await until(lambda: _attempts(receiver, 4), what="the first requests in flight")
        procs[0].send_signal(signal.SIGKILL)
        assert await asyncio.wait_for(procs[0].wait(), 10) == -signal.SIGKILL
        # Its claims are still held (nobody else may send them), then its lease runs out.
        assert await _held(pool) > 0
        procs.append(
            await asyncio.create_subprocess_exec(sys.executable, "-m", "gateway", "forward", env=env)
        )
        await until(lambda: _delivered(pool, 30), timeout_s=60, what="everything delivered after the kill")
        expected = {stdwebhooks.webhook_id("crm", k) for k in keys}
        assert set(receiver.state.processed) == expected  # nothing lost, nothing unexpected
        # Each event is processed once; what the dead one had sent arrived again, deduplicated.
        assert sum(receiver.state.duplicates.values()) == len(receiver.state.attempts) - 30
        assert len(receiver.state.attempts) <= 30 + 12  # at most what it held, sent twice
        assert await pool.fetchval("SELECT count(*) FROM delivery_leases WHERE cardinality(ids) > 0") == 0
    finally:
        for p in procs:
            if p.returncode is None:
                p.send_signal(signal.SIGTERM)
                assert await asyncio.wait_for(p.wait(), 20) == 0
        await receiver.close()
