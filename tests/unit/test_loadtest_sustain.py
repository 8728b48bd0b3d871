"""bench-pipeline's search for the highest sustained rate (loadtest.harness.sustain)."""

from __future__ import annotations

import pytest

from loadtest.harness.sustain import Probe, Search


@pytest.mark.parametrize(
    ("rate", "backlog", "errors", "kept"),
    [
        (400.0, 0.0, 0, True),
        (400.0, 100.0, 0, True),  # a quarter of a second's input: the slack
        (400.0, 101.0, 0, False),
        (400.0, 0.0, 1, False),  # a webhook not acknowledged
        (1.0, 0.0, 0, True),
    ],
)
def test_a_probe_kept_up_when_its_backlog_is_within_the_slack(
    rate: float, backlog: float, errors: int, kept: bool
) -> None:
    assert Probe(rate, backlog, errors).kept_up() is kept


def _run(capacity: float, lo: float, hi: float, **kw: float) -> Search:
    """A search against a pipeline that keeps up exactly below ``capacity``."""
    s = Search(lo, hi, **kw)  # type: ignore[arg-type]
    while (rate := s.next_rate()) is not None:
        s.record(Probe(rate, 0.0 if rate < capacity else rate))
    return s


@pytest.mark.parametrize(
    ("capacity", "lo", "hi"),
    [(600.0, 50.0, 10_000.0), (3_000.0, 50.0, 10_000.0), (120.0, 50.0, 5_000.0), (9_000.0, 100.0, 10_000.0)],
)
def test_the_search_ends_within_its_tolerance_below_the_capacity(
    capacity: float, lo: float, hi: float
) -> None:
    s = _run(capacity, lo, hi, tolerance=0.1, max_probes=12)
    assert s.sustained < capacity
    assert s.sustained * 1.1 * 1.01 >= capacity  # within the tolerance (and the rounding)
    assert s.hi <= s.lo * 1.1


def test_the_first_probe_is_the_geometric_middle() -> None:
    assert Search(50.0, 10_000.0).next_rate() == 707.0


def test_the_search_stops_at_its_probe_budget() -> None:
    s = _run(600.0, 1.0, 1e9, tolerance=0.01, max_probes=3)
    assert len(s.probes) == 3
    assert s.next_rate() is None


def test_nothing_sustained_when_no_probe_kept_up() -> None:
    s = _run(10.0, 50.0, 10_000.0, max_probes=4)
    assert s.sustained == 0.0
    assert all(not p.kept_up() for p in s.probes)


def test_a_probe_that_failed_above_one_that_kept_up_does_not_lower_the_result() -> None:
    # Noise: 500 kept up, 450 did not; the result is still the highest rate kept up.
    s = Search(50.0, 1_000.0)
    s.record(Probe(500.0, 0.0))
    s.record(Probe(450.0, 450.0))
    assert s.sustained == 500.0
    assert s.next_rate() is None  # hi (450) is below lo (500): nothing left to bisect


def _result(pipeline_rate: float) -> dict[str, object]:
    dest = {"format": "standard", "p50_ms": 5.0, "p90_ms": 9.0, "p99_ms": 20.0, "max_ms": 30.0,
            "processed": 10, "missing": 0, "duplicates": 0, "bad_signatures": 0}  # fmt: skip
    probe = {"rate": 707.0, "backlog": 900.0, "errors": 0, "kept_up": False, "pending": 0,
             "undelivered": 1800, "settled_s": 2.5}  # fmt: skip
    return {
        "load_average": [0.1, 0.1, 0.1],
        "parameters": {"seconds": 20.0},
        "pipeline": {"rate": pipeline_rate, "low": 50.0, "high": 707.0, "probes": [probe]},
        "latency": {
            "rate": 25.0,
            "events": 10,
            "destinations": {"std": dest},
            "acks": {"errors": {}},
            "segments": {},
            "cores": {"machine": 1.0, "steal": 0.25},
        },
        "deliveries": {"delivered": 10},
    }


def test_the_pipeline_bench_fails_when_no_probed_rate_kept_up() -> None:
    from loadtest.harness.pipeline_report import verdict

    failed = verdict(_result(0.0))
    assert not failed.passed
    assert any("kept up at no rate" in c for c in failed.failed_checks)
    assert verdict(_result(600.0)).passed


def test_the_pipeline_bench_prints_its_probes_and_the_stolen_cpu() -> None:
    from loadtest.harness.pipeline_report import table

    text = table(_result(600.0))
    assert "pipeline saturation (both destinations enabled): 600 webhooks/s" in text
    assert "fell behind at 707/s" in text
    probe_row = next(line for line in text.splitlines() if line.startswith("707"))
    assert probe_row.split()[1:6] == ["0", "1800", "0", "no", "2.5"]
    assert "steal 0.25" in text
