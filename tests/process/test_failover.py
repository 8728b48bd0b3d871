"""A PostgreSQL failover under load, end to end: `python -m loadtest chaos --failover` for one
round on a real Patroni cluster (etcd, three nodes on the wheel's PostgreSQL, a synchronous
standby), its primary's node SIGKILLed. The gateway is not restarted: it must follow the new
primary by itself, lose no acknowledged webhook, process each event once and send nothing
twice. Skipped, saying why, only where etcd or Patroni cannot be installed (.ci/run installs
etcd-server; `make test` runs `make ha` for Patroni)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.testing.patroni import unavailable

pytestmark = [pytest.mark.slow, pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))]


def test_a_killed_primary_fails_over_and_every_promise_holds(tmp_path: Path) -> None:
    argv = [
        sys.executable, "-m", "loadtest", "chaos", "--failover",
        "--rounds", "1", "--round-s", "65", "--rate", "30", "--send-rate", "2",
        "--drain-timeout", "60", "--results", str(tmp_path),
    ]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=170)
    (result_file,) = tmp_path.glob("chaos-failover-*.json")
    result = json.loads(result_file.read_text())
    # Not this test's to judge: the 5 s target from promotion to the first 200 (a benchmark's),
    # and the pair interval as the fake receives sends (pacing is decided before the claim's
    # COMMIT, whose latency varies while a synchronous standby reattaches; the chaos run
    # reports it).
    skip = ("(target)", "pair interval")
    failed = [
        c for c in result["verification"]["checks"] if not c["ok"] and not any(k in c["name"] for k in skip)
    ]
    assert not failed, proc.stdout + proc.stderr[-3000:]
    (r,) = result["rounds"]
    assert r["fault"] == "kill" and r["promoted"] != r["old_leader"] and r["promoted_was_sync"], r
    assert r["answered_503"] > 0, r  # webhooks came during the failover, and were refused
    assert r["notes"] == [], r
    assert result["webhooks"]["sent"] > 0 and result["sends"]["accepted"] > 0
