"""bench-pipeline's split of receipt -> downstream into segments (loadtest.harness.segments)."""

from __future__ import annotations

import math

import pytest

from gateway.core import stdwebhooks
from loadtest.harness.segments import SEGMENTS, split


def _row(key: str, name: str, stored: float, keyed: float, queued: float) -> dict[str, object]:
    return {"event_key": key, "name": name, "stored": stored, "keyed": keyed, "queued": queued}


def test_each_segment_is_the_gap_between_two_marks() -> None:
    rows = [_row("msg:a", "std", 100.002, 100.010, 100.011), _row("msg:a", "meta", 100.002, 100.010, 100.012)]
    received = {
        "std": {stdwebhooks.webhook_id("std", "msg:a"): 100.031},
        "meta": {stdwebhooks.webhook_id("meta", "msg:a"): 100.052},
    }
    out = split(rows, {"msg:a": 100.0}, received)
    assert list(out) == list(SEGMENTS)
    assert out["sent -> stored"]["p50_ms"] == pytest.approx(2.0)
    assert out["stored -> keyed"]["p99_ms"] == pytest.approx(8.0)
    # per destination: 1 ms and 2 ms to the delivery row, 20 ms and 40 ms to the receiver
    assert out["keyed -> delivery row"]["p99_ms"] == pytest.approx(2.0)
    assert out["keyed -> delivery row"]["p50_ms"] in (pytest.approx(1.0), pytest.approx(2.0))
    assert out["delivery row -> received"]["p99_ms"] == pytest.approx(40.0)
    assert out["delivery row -> received"]["max_ms"] == pytest.approx(40.0)
    assert out["keyed -> delivery row"]["max_ms"] == pytest.approx(2.0)
    assert all(v["n"] == 2 for v in out.values())


@pytest.mark.parametrize(
    ("sent", "received"),
    [
        ({}, {"std": {stdwebhooks.webhook_id("std", "msg:a"): 1.0}}),  # not one of this run's events
        ({"msg:a": 0.5}, {"std": {}}),  # never reached its receiver
        ({"msg:a": 0.5}, {}),  # a destination the run does not know
    ],
)
def test_an_event_without_both_ends_is_left_out(
    sent: dict[str, float], received: dict[str, dict[str, float]]
) -> None:
    out = split([_row("msg:a", "std", 0.6, 0.7, 0.8)], sent, received)
    assert all(v["n"] == 0 and math.isnan(v["p50_ms"]) for v in out.values())
