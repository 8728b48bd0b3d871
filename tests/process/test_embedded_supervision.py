"""The embedded PostgreSQL is supervised both ways: a SIGKILLed gateway does not leave it
running for ever (gateway.runtime.pgwatch stops it), and a gateway whose server died exits
non-zero with a message saying so, instead of answering /healthz 200 for ever."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from gateway.runtime import pgwatch
from tests.support.procs import free_port, spawn, wait_healthy

pytestmark = pytest.mark.slow

# Bounds on the test, not speed claims: initdb and start-up are slow on a loaded machine.
START_S = 180.0
GIVE_UP_S = 90.0


def spawn_embedded(data: Path, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {"DATABASE_URL": "", "GATEWAY_DATA_DIR": str(data), "GATEWAY_PORT": str(port)}
    return spawn(["serve"], env, str(log)), f"http://127.0.0.1:{port}"


async def until(check: object, what: str) -> None:
    deadline = time.monotonic() + GIVE_UP_S
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not after {GIVE_UP_S}s")
        await asyncio.sleep(0.2)


def postmaster_pid(pgdata: Path) -> int:
    return int((pgdata / "postmaster.pid").read_text().split()[0])


async def test_embedded_server_is_supervised(pg_dir: Path) -> None:
    data = pg_dir / "var"
    pgdata = data / "pgdata"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        # 1. SIGKILL the gateway: the server does not outlive every user of it.
        gw, base = spawn_embedded(data, pg_dir / "gw1.log")
        procs.append(gw)
        await wait_healthy(base, gw, timeout=START_S)
        assert pgwatch.postmaster_running(pgdata)
        gw.send_signal(signal.SIGKILL)
        gw.wait()
        await until(
            lambda: not pgwatch.postmaster_running(pgdata), "server left running by a SIGKILLed gateway"
        )

        # 2. A new gateway starts it again; then the server dies under it.
        gw, base = spawn_embedded(data, pg_dir / "gw2.log")
        procs.append(gw)
        await wait_healthy(base, gw, timeout=START_S)
        os.kill(postmaster_pid(pgdata), signal.SIGKILL)
        await until(lambda: gw.poll() is not None, "gateway still up with its embedded server dead")
        assert gw.returncode == 1
        assert "embedded PostgreSQL" in (pg_dir / "gw2.log").read_text()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        if pgwatch.postmaster_running(pgdata):
            pgwatch._stop_server(pgdata)
