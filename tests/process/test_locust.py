"""The Locust file as Locust users run it: headless against a started gateway, the exactly-once
verification in ``test_stop`` deciding the exit code. Locust is an optional extra: without it
(or LOCUST_BIN naming its executable) this test is skipped."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.procs import free_port, spawn

LOCUSTFILE = Path(__file__).parents[2] / "loadtest" / "locustfile.py"
META = "locust-meta-secret"


def _locust() -> str:
    found = os.environ.get("LOCUST_BIN") or shutil.which("locust")
    sibling = Path(sys.executable).with_name("locust")
    if not found and sibling.exists():
        found = str(sibling)
    if not found:
        if os.environ.get("CI"):
            pytest.fail("locust must be installed (make test installs the locust extra)")
        pytest.skip("locust is not installed (pip install -e '.[locust]', or set LOCUST_BIN)")
    return found


def _run(locust: str, port: int, dsn: str, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GATEWAY_", "LOADTEST_"))}
    env.update(
        {"GATEWAY_META_APP_SECRETS": META, "DATABASE_URL": dsn, "LOADTEST_PROFILE": "ramp:5:20:3+const:20:3"}
    )
    return subprocess.run(
        [
            locust,
            "-f",
            str(LOCUSTFILE),
            "--host",
            f"http://127.0.0.1:{port}",
            "--headless",
            "--only-summary",
            *extra,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


@pytest.mark.slow
async def test_locust_run_is_verified_and_sets_the_exit_code(db_dsn: str, tmp_path: Path) -> None:
    from tests.support.procs import wait_healthy

    locust = _locust()
    port = free_port()
    env = {
        "DATABASE_URL": db_dsn,
        "GATEWAY_PORT": str(port),
        "GATEWAY_META_APP_SECRETS": META,
        "GATEWAY_RUN_SENDER": "false",
        "GATEWAY_LOG_LEVEL": "warning",
    }
    proc = spawn(["serve"], env, str(tmp_path / "gateway.log"))
    try:
        await wait_healthy(f"http://127.0.0.1:{port}", proc)
        ok = _run(locust, port, db_dsn)
        assert ok.returncode == 0, ok.stdout + ok.stderr
        assert "PASS" in ok.stdout and "inbound_messages: none missing" in ok.stdout
        assert "Meta users only" in ok.stderr  # no Tenashi secret given
        assert "TenashiEvents" not in ok.stdout + ok.stderr
    finally:
        proc.terminate()
        proc.wait(15)
    # The same database, now with no consumers running: the new events stay pending, the
    # verification fails after its drain timeout, and so does the run.
    env["GATEWAY_RUN_CONSUMERS"] = "false"
    proc = spawn(["serve"], env, str(tmp_path / "gateway2.log"))
    try:
        await wait_healthy(f"http://127.0.0.1:{port}", proc)
        bad = _run(locust, port, db_dsn, "--drain-timeout", "2")
        assert bad.returncode == 1, bad.stdout + bad.stderr
        assert "exactly-once verification failed" in bad.stderr
    finally:
        proc.terminate()
        proc.wait(15)
