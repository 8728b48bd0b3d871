"""Benchmarks' verdicts: a target is judged only where it applies."""

from __future__ import annotations

import pytest

from loadtest.bench_graph import verdict


@pytest.mark.parametrize(
    ("p99", "wrong", "rate", "half", "code", "says"),
    [
        (30.0, 0, 500.0, 500.0, 0, "met (30.0 ms)"),
        (80.0, 0, 500.0, 500.2, 1, "MISSED (80.0 ms)"),
        (30.0, 2, 500.0, 500.0, 1, "MISSED, 2 answers not 200"),
        # Another --rate: the p99 target is not judged, wrong answers still fail the run.
        (30.0, 0, 20.0, 500.0, 0, "not judged; answers all 200"),
        (900.0, 0, 20.0, 500.0, 0, "not at half the sender's saturation (500/s)"),
        (30.0, 1, 20.0, 500.0, 1, "answers NOT all 200"),
    ],
)
def test_bench_graph_verdict(p99: float, wrong: int, rate: float, half: float, code: int, says: str) -> None:
    line, got = verdict(p99, wrong, rate, half)
    assert got == code and says in line, line
