"""Gateway commands as real subprocesses: long-running ones (``spawn``, ``wait_healthy``) and
one-shot CLI calls (``gateway_cli``, ``gateway_ok``; ``run_cli`` with an environment of the
test's own); a load-harness command to its end (``run_loadtest``)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Mapping

import aiohttp
import psutil

from gateway.testing.fake_provider import FakeProvider
from gateway.testing.ports import closed_port, free_port

__all__ = [
    "alive",
    "closed_port",
    "free_port",
    "gateway_cli",
    "gateway_ok",
    "kill_if_alive",
    "run_cli",
    "run_loadtest",
    "spawn",
    "spawn_send",
    "wait_healthy",
]


def alive(p: psutil.Process) -> bool:
    """Whether ``p`` still runs: neither gone nor a zombie, even when it dies between the checks."""
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def kill_if_alive(p: psutil.Process) -> None:
    """SIGKILL ``p`` unless it is already gone (a test's clean-up after a failure)."""
    with contextlib.suppress(psutil.NoSuchProcess):
        if p.is_running():
            p.kill()


def spawn(args: list[str], env: Mapping[str, str], log_path: str | None = None) -> subprocess.Popen[bytes]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    # One process unless a test asks for more (`serve` defaults to a layout by core count).
    full_env["GATEWAY_WORKERS"] = "1"
    full_env["GATEWAY_SERVE_SERVICES"] = "inline"
    full_env.update(env)
    out = open(log_path, "wb") if log_path else subprocess.DEVNULL  # noqa: SIM115
    return subprocess.Popen(
        [sys.executable, "-m", "gateway", *args], env=full_env, stdout=out, stderr=subprocess.STDOUT
    )


async def wait_healthy(base_url: str, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"gateway exited with {proc.returncode} before becoming ready")
            try:
                async with http.get(f"{base_url}/readyz") as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)
    raise TimeoutError(f"{base_url} not ready after {timeout}s")


async def gateway_cli(dsn: str, *args: str, env: Mapping[str, str] | None = None) -> tuple[int, str, str]:
    """``gateway <args>`` against ``dsn``: (exit code, stdout, stderr)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gateway",
        *args,
        env={**os.environ, "DATABASE_URL": dsn, "GATEWAY_LOG_LEVEL": "warning", **(env or {})},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def run_cli(*args: str, env: Mapping[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``gateway <args>`` to its end with ``env`` as its whole environment (nothing inherited)."""
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args],
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def run_loadtest(*args: str, database_url: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``python -m loadtest <args>`` to its end on ``database_url``'s server, with this
    environment less its GATEWAY_ settings (the command's own defaults apply)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    return subprocess.run(
        [sys.executable, "-m", "loadtest", *args],
        env={**env, "DATABASE_URL": database_url},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


async def gateway_ok(dsn: str, *args: str, env: Mapping[str, str] | None = None) -> str:
    """``gateway <args>`` that must succeed: its stdout."""
    rc, out, err = await gateway_cli(dsn, *args, env=env)
    assert rc == 0, err
    return out


async def spawn_send(dsn: str, fake: FakeProvider) -> asyncio.subprocess.Process:
    """`gateway send` as its own process, sending to the fake."""
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gateway",
        "send",
        env={
            **os.environ,
            "DATABASE_URL": dsn,
            "GATEWAY_GRAPH_URL": fake.url + "/v21.0",
            "GATEWAY_GRAPH_TOKEN": "t",
            "GATEWAY_SEND_POLL_MS": "50",
            "GATEWAY_LOG_LEVEL": "warning",
        },
    )
