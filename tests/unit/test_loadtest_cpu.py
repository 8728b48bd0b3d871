"""The benchmarks' CPU accounting (loadtest.harness.cpu.charge): processes that live through a
phase, are born in it or end in it are each charged once, to their group."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from loadtest.harness.cpu import CpuMeter, Sample, charge

PG, BACKEND, VACUUM, OTHER = 10, 11, 12, 99

CASES = [
    pytest.param(
        {PG: Sample(1.0, 0.0, 1), BACKEND: Sample(2.0, 0.0, PG)},
        {PG: Sample(1.5, 0.0, 1), BACKEND: Sample(2.25, 0.0, PG)},
        {"postgres": [PG, BACKEND]},
        {"postgres": 0.75},
        id="both live through the phase",
    ),
    pytest.param(
        {PG: Sample(1.0, 0.0, 1)},
        {PG: Sample(1.0, 0.5, 1), BACKEND: Sample(0.125, 0.0, PG)},
        {"postgres": [PG, BACKEND]},
        {"postgres": 0.625},
        id="a worker born and ended in the phase is charged all it used, one born and alive too",
    ),
    pytest.param(
        {PG: Sample(1.0, 0.0, 1), VACUUM: Sample(3.0, 0.0, PG)},
        {PG: Sample(1.0, 3.5, 1)},
        {"postgres": [PG]},
        {"postgres": 0.5},
        id="one that ended is charged only what it used after the start",
    ),
    pytest.param(
        {PG: Sample(1.0, 0.0, 1), VACUUM: Sample(3.0, 0.0, OTHER)},
        {PG: Sample(1.0, 0.0, 1)},
        {"postgres": [PG]},
        {"postgres": 0.0},
        id="one whose parent is not counted is lost, not taken from another group",
    ),
    pytest.param(
        {PG: Sample(1.0, 0.0, 1), BACKEND: Sample(2.0, 0.0, PG, born=5.0)},
        {PG: Sample(1.0, 2.5, 1), BACKEND: Sample(0.25, 0.0, PG, born=9.0)},
        {"postgres": [PG, BACKEND]},
        {"postgres": 0.75},
        id="a pid reused in the phase: the one that ended and the one born are told apart",
    ),
    pytest.param(
        {PG: Sample(1.0, 0.0, 1), BACKEND: Sample(1.0, 0.0, PG)},
        {PG: Sample(1.0, 1.5, 1), OTHER: Sample(4.0, 0.0, 1)},
        {"postgres": [PG], "server": [OTHER]},
        {"postgres": 0.5, "server": 4.0},
        id="groups are charged apart",
    ),
]


@pytest.mark.parametrize(("before", "after", "groups", "want"), CASES)
def test_charge(
    before: dict[int, Sample], after: dict[int, Sample], groups: dict[str, list[int]], want: dict[str, float]
) -> None:
    assert charge(groups, before, after) == pytest.approx(want)


def test_a_child_that_ends_in_the_phase_is_counted() -> None:
    meter = CpuMeter(os.getpid(), None, groups=lambda: {"me": [os.getpid()]})
    meter.start()
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass"
    subprocess.run([sys.executable, "-c", burn], check=True)
    # /proc counts in clock ticks (10 ms): the child's 0.3 s may read a tick short
    assert meter.used()["me"] >= 0.28
