"""Spacing of woken steps (gateway.core.spacing)."""

from __future__ import annotations

import pytest

from gateway.core.spacing import Spacing


@pytest.mark.parametrize(
    ("calls", "waits"),
    [
        # (kind, now): "r" a woken step reserves, "s" a backlog step started; waits of the "r"s
        ([("r", 10.0)], [0.0]),  # the first wake-up waits for nothing
        ([("r", 10.0), ("r", 10.002)], [0.0, 0.003]),  # 2 ms after a start: the rest of 5 ms
        ([("r", 10.0), ("r", 10.010)], [0.0, 0.0]),  # after a quiet spell: at once
        ([("r", 10.0), ("r", 10.001), ("r", 10.001)], [0.0, 0.004, 0.009]),  # woken together: apart
        ([("s", 10.0), ("r", 10.001)], [0.004]),  # a backlog step counts as a start
        ([("r", 10.0), ("s", 10.004), ("r", 10.005)], [0.0, 0.004]),  # the last start counts
        ([("r", 10.0), ("s", 10.001), ("r", 10.002)], [0.0, 0.004]),  # a backlog step pushes it
    ],
)
def test_woken_steps_start_at_least_the_interval_apart(
    calls: list[tuple[str, float]], waits: list[float]
) -> None:
    s = Spacing(0.005)
    got = []
    for kind, now in calls:
        if kind == "r":
            got.append(s.reserve(now))
        else:
            s.started(now)
    assert got == pytest.approx(waits, abs=1e-9)


def test_a_zero_interval_never_waits() -> None:
    s = Spacing(0.0)
    assert [s.reserve(1.0), s.reserve(1.0), s.reserve(1.0)] == [0.0, 0.0, 0.0]
