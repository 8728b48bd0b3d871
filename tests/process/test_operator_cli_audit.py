"""The command line's operator actions land in the audit log, with who ran them."""

from __future__ import annotations

import getpass
import os
import subprocess
import sys

import asyncpg

from tests.support.consume import dead_row


def gateway(*args: str, dsn: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    env["DATABASE_URL"] = dsn
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def test_cli_actions_are_audited_with_the_user_or_actor(db_dsn: str) -> None:
    conn = await asyncpg.connect(db_dsn)
    try:
        rid = await dead_row(conn, b"not json")
        done = gateway("dead", "replay", f"R{rid}", "--actor", "alice@oncall", dsn=db_dsn)
        assert done.returncode == 0, done.stderr
        refused = gateway("senders", "resume", "number", "1111", dsn=db_dsn)
        assert refused.returncode == 1 and "not open" in refused.stderr
        bad = gateway("senders", "resume", "number", "1111", "--actor", "x" * 200, dsn=db_dsn)
        assert bad.returncode == 2  # refused by the parser: nothing ran, nothing recorded
        rows = await conn.fetch("SELECT actor, via, action, target, rows FROM operator_actions ORDER BY id")
    finally:
        await conn.close()
    assert [tuple(r) for r in rows] == [
        ("alice@oncall", "cli", "dead.replay", f"R{rid}", 1),
        (getpass.getuser(), "cli", "senders.resume", "number/meta/1111", 0),
    ]
