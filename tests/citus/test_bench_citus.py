"""bench-citus on a small workload: the consumers drain it on one PostgreSQL and on a Citus
coordinator with two workers, each drain checked exactly once, both rates and the
coordinator's statements reported, the nodes' directories removed. (Nothing about speed
here: the figures come from a run at full size, loadtest/README.md.)"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from gateway.testing import citus


def test_both_drain_every_event_once(tmp_path: Path) -> None:
    given = Path(os.environ["GATEWAY_TEST_CITUS"])
    root = citus.build(given) if given.is_file() else given
    # Not under tmp_path: pytest makes that 0700, and as root the nodes run as the wheel's user.
    nodes = Path(tempfile.mkdtemp(prefix="gateway-test-bench-citus-"))
    os.chmod(nodes, 0o755)  # noqa: S103 - the postgres user must traverse it
    results = tmp_path / "results"
    args = ("--events", "300", "--build", str(root), "--results", str(results))
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("GATEWAY_", "DATABASE_URL"))}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "loadtest", "bench-citus", *args],
            env={**clean, "TMPDIR": str(nodes)},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        left = list(nodes.iterdir())
    finally:
        shutil.rmtree(nodes, ignore_errors=True)
    out = done.stdout
    assert done.returncode == 0, out[-3000:] + done.stderr[-3000:]
    assert out.splitlines()[-1].startswith("PASS (cluster / one PostgreSQL "), out[-2000:]
    assert "FAILED" not in out
    for name in ("one PostgreSQL", "Citus, coordinator + 2 workers"):
        assert any(line.startswith(name + " ") and line.split()[-1] != "-" for line in out.splitlines()), name
    assert "pg_stat_statements (Citus, coordinator + 2 workers on the coordinator" in out
    assert "inbox_apply_batch" in out  # the consumers' own statements were counted on the coordinator
    (path,) = results.glob("bench-citus-*.json")
    rates = json.loads(path.read_text())["rates"]
    assert [len(r) for r in rates.values()] == [1, 1] and all(r[0] > 0 for r in rates.values())
    assert left == []  # the nodes (their data directories) are removed
