"""Run gateway commands as real subprocesses (for crash tests)."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import Mapping

import aiohttp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def spawn(args: list[str], env: Mapping[str, str], log_path: str | None = None) -> subprocess.Popen[bytes]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    # One process unless a test asks for more (`serve` defaults to one per core).
    full_env["GATEWAY_WORKERS"] = "1"
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
