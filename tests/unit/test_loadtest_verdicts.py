"""Benchmarks' verdicts: a target is judged only where it applies."""

from __future__ import annotations

import pytest

from loadtest.bench_graph import Phase, verdict


def _phase(rate: float, p99: float, answered_share: float = 1.0, wrong: int = 0) -> Phase:
    """A phase of 100 answers at ``rate`` whose 99th percentile is ``p99`` ms."""
    return Phase(rate, latencies=[1.0] * 98 + [p99, p99], wrong=["HTTP 500"] * wrong,
                 elapsed_s=100 / (rate * answered_share))  # fmt: skip


@pytest.mark.parametrize(
    ("quarter", "half", "asked", "passed", "says"),
    [
        (_phase(250, 20), _phase(500, 30), 0.0, True, "PASS"),
        (_phase(250, 20), _phase(500, 80), 0.0, False, "p99 at half of the sender's saturation (500/s): 80"),
        # Latency that grows with the rate below saturation fails at a quarter too.
        (_phase(250, 60), _phase(500, 30), 0.0, False, "p99 at a quarter"),
        (
            _phase(250, 20),
            _phase(500, 30, answered_share=0.5),
            0.0,
            False,
            "answered at half of the sender's",
        ),
        (_phase(250, 20), _phase(500, 30, wrong=2), 0.0, False, "at 500/s 2 answers not 200 with a wamid"),
    ],
)
def test_bench_graph_verdict(quarter: Phase, half: Phase, asked: float, passed: bool, says: str) -> None:
    v = verdict({"a quarter": quarter, "half": half}, 1000.0, asked)
    assert v.passed is passed and says in v.summary(), v.summary()


@pytest.mark.parametrize(("wrong", "passed"), [(0, True), (1, False)])
def test_bench_graph_at_another_rate_judges_only_the_answers(wrong: int, passed: bool) -> None:
    v = verdict({"20/s": _phase(20, 900, answered_share=0.1, wrong=wrong)}, 1000.0, 20.0)
    assert v.passed is passed and not v.targets
    assert "not at shares of the sender's saturation (1000/s)" in v.notes[0]
