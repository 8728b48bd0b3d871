"""Benchmarks' verdicts: a target is judged only where it applies."""

from __future__ import annotations

import argparse

import pytest

from loadtest.bench_graph import judge
from loadtest.harness import contract


@pytest.mark.parametrize(
    ("p99", "wrong", "rate", "half", "passed", "says"),
    [
        (30.0, 0, 500.0, 500.0, True, "PASS"),
        (80.0, 0, 500.0, 500.2, False, "p99 at half the sender's saturation: 80 ms (goal <= 50 ms)"),
        (30.0, 2, 500.0, 500.0, False, "every answer 200 with a wamid: 2 were not"),
        # Another --rate: the p99 target is not judged, wrong answers still fail the run.
        (30.0, 0, 20.0, 500.0, True, "p99 not judged"),
        (900.0, 0, 20.0, 500.0, True, "not at half the sender's saturation (500/s)"),
        (30.0, 1, 20.0, 500.0, False, "1 were not"),
    ],
)
def test_bench_graph_verdict(
    p99: float, wrong: int, rate: float, half: float, passed: bool, says: str
) -> None:
    run = contract.Run(argparse.Namespace(command="bench-graph"))
    judge(run, p99, wrong, rate, half)
    summary = run.verdict.summary()
    assert run.verdict.passed is passed and says in summary + "; ".join(run.verdict.notes), summary
