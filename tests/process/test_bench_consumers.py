"""bench-consumers end to end on a small workload: each strategy drains the same staged rows
exactly once (its checks), PGQueuer drains as many jobs, and every rate comes with the CPU it
took. (It says nothing about speed here: the figures come from a full run, docs/benchmarks.md.)"""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.procs import run_loadtest


def test_bench_consumers_drains_exactly_once_and_measures_cpu(pg_admin_dsn: str, tmp_path: Path) -> None:
    args = ["bench-consumers", "--events", "600", "--rounds", "1", "--results", str(tmp_path)]
    done = run_loadtest(*args, database_url=pg_admin_dsn)
    out = done.stdout + done.stderr
    [result] = [json.loads(p.read_text()) for p in tmp_path.glob("bench-consumers-*.json")]
    assert result["verdict"]["failed_checks"] == [], out[-3000:]
    assert done.returncode == (0 if result["verdict"]["verdict"] == "PASS" else 1), out[-3000:]
    assert [t["name"] for t in result["verdict"]["targets"]] == [
        "consumers / one transaction per event",
        "consumers / PGQueuer no-op jobs (its best batch)",
    ]
    strategies = {"naive", "consumers", "pgqueuer b10", "pgqueuer b100"}
    assert set(result["rates"]) == set(result["cpu_us_per_event"]) == strategies
    for name in strategies:
        assert result["rates"][name][0] > 0, name
        assert result["cpu_us_per_event"][name][0] > 0, name
    # The test server runs here: PostgreSQL's processes are measured with the benchmark's own.
    assert "CPU per event, this process and PostgreSQL:" in done.stdout, out[-3000:]
