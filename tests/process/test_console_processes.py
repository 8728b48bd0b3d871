"""Where the console listens: `gateway console` alone, and `gateway serve` with its console
once, from the parent, however many workers; never on the public port."""

from __future__ import annotations

import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest

from gateway.testing.ports import free_port
from tests.support.procs import spawn

TOKENS = "ops:ops-token-0123456789abcdef"


def status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:  # noqa: S310 - a local test URL
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


def wait_status(url: str, want: int, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"exited with {proc.returncode}"
        if status(url) == want:
            return
        time.sleep(0.1)
    raise TimeoutError(url)


def stop(proc: subprocess.Popen[bytes]) -> int:
    proc.terminate()
    try:
        return proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise


def listeners(port: int) -> set[int]:
    return {
        c.pid for c in psutil.net_connections(kind="tcp")
        if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN and c.pid
    }  # fmt: skip


@pytest.mark.slow
def test_serve_with_workers_runs_one_console_in_the_parent(db_dsn: str, tmp_path: Path) -> None:
    port, console = free_port(), free_port()
    env = {
        "DATABASE_URL": db_dsn, "GATEWAY_PORT": str(port), "GATEWAY_WORKERS": "2",
        "GATEWAY_CONSOLE_PORT": str(console), "GATEWAY_CONSOLE_TOKENS": TOKENS,
    }  # fmt: skip
    proc = spawn(["serve"], env, str(tmp_path / "serve.log"))
    try:
        wait_status(f"http://127.0.0.1:{port}/readyz", 200, proc)
        wait_status(f"http://127.0.0.1:{console}/login", 200, proc)
        workers = psutil.Process(proc.pid).children()
        assert len([w for w in workers if "serve" in " ".join(w.cmdline())]) == 2
        assert listeners(console) == {proc.pid}  # the parent alone: one console for all
        assert status(f"http://127.0.0.1:{port}/login") == 404  # the public port never serves it
    finally:
        assert stop(proc) == 0


def test_console_alone_and_a_busy_console_port(db_dsn: str, tmp_path: Path) -> None:
    console = free_port()
    env = {"DATABASE_URL": db_dsn, "GATEWAY_CONSOLE_PORT": str(console), "GATEWAY_CONSOLE_TOKENS": TOKENS}
    proc = spawn(["console"], env, str(tmp_path / "console.log"))
    try:
        wait_status(f"http://127.0.0.1:{console}/login", 200, proc)
        # A second one on the same port says so and exits 3 (cannot start).
        second = spawn(["console"], env, str(tmp_path / "second.log"))
        assert second.wait(60) == 3
        assert "GATEWAY_CONSOLE_PORT" in (tmp_path / "second.log").read_text()
    finally:
        assert stop(proc) == 0
    unset = spawn(["console"], {"DATABASE_URL": db_dsn}, str(tmp_path / "unset.log"))
    assert unset.wait(30) == 2
