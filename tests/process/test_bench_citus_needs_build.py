"""bench-citus without a Citus build: it says how to make one and exits 2, having measured
and written nothing (its run on a build: tests/citus/test_bench_citus.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def bench_citus(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("GATEWAY_", "DATABASE_URL"))}
    return subprocess.run(
        [sys.executable, "-m", "loadtest", "bench-citus", *args],
        env={**clean, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_without_a_build_it_says_how_to_make_one(tmp_path: Path) -> None:
    done = bench_citus("--results", str(tmp_path), env={"XDG_CACHE_HOME": str(tmp_path / "empty")})
    assert done.returncode == 2, done.stdout + done.stderr
    assert "make test-citus CITUS_TARBALL=" in done.stderr
    assert "python -m gateway.testing.citus build --tarball" in done.stderr
    assert not list(tmp_path.glob("*.json"))  # nothing measured, nothing written
