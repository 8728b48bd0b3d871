"""The outcome waiter's memory of outcomes heard before anyone waited: bounded in count and age,
and only final states."""

from __future__ import annotations

import pytest

from gateway.core.settings import Settings
from gateway.outbound import outcomes
from gateway.outbound.outcomes import OutboxOutcome, OutcomeWaiter


@pytest.mark.parametrize(
    ("payloads", "kept"),
    [
        (["1 accepted wamid.A"], {1: OutboxOutcome("accepted", "wamid.A")}),
        (["1 sending ", "2 pending "], {}),  # not final: nothing to answer with
        (["1 unknown ", "1 accepted wamid.A"], {1: OutboxOutcome("accepted", "wamid.A")}),  # the last one
        (["x accepted wamid.A", "1 2", ""], {}),  # not ours
        ([f"{i} failed " for i in range(1, 6)], {i: OutboxOutcome("failed", None) for i in (3, 4, 5)}),
    ],
)
def test_outcomes_heard_before_a_wait_are_kept_within_bounds(
    monkeypatch: pytest.MonkeyPatch, payloads: list[str], kept: dict[int, OutboxOutcome]
) -> None:
    monkeypatch.setattr(outcomes, "RECENT_MAX", 3)
    w = OutcomeWaiter(Settings())
    for p in payloads:
        w._heard(p)
    assert {k: v for k, (_, v) in w._recent.items()} == kept


def test_old_outcomes_are_forgotten() -> None:
    now = [1000.0]
    w = OutcomeWaiter(Settings())
    w.clock = lambda: now[0]
    w._heard("1 accepted wamid.A")
    now[0] += outcomes.RECENT_S + 1
    w._heard("2 accepted wamid.B")
    assert list(w._recent) == [2]
