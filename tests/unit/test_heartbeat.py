"""A loop that has not beaten within its bound is stale; one that ended on purpose is not."""

from __future__ import annotations

import pytest

from gateway.core.heartbeat import Heartbeats, Stale


def test_a_loop_is_stale_once_it_misses_its_bound() -> None:
    t = [100.0]
    hb = Heartbeats(lambda: t[0])
    consumer = hb.loop("consumer-0", 10.0)
    job = hb.loop("maintenance: retention", 3700.0)
    t[0] += 9.5
    assert hb.stale() == []
    consumer()
    t[0] += 10.0
    assert hb.stale() == []  # exactly the bound: still alive
    t[0] += 0.5
    assert hb.stale() == [Stale("consumer-0", 10.5, 10.0)]
    consumer()
    assert hb.stale() == []
    t[0] += 3700.0
    assert [s.name for s in hb.stale()] == ["maintenance: retention", "consumer-0"]  # oldest first
    job.done()
    consumer.done()
    assert hb.stale() == [] and len(hb) == 0


def test_two_loops_of_one_name_are_two_loops() -> None:
    t = [0.0]
    hb = Heartbeats(lambda: t[0])
    a, b = hb.loop("sender", 5.0), hb.loop("sender", 5.0)
    t[0] = 6.0
    a()
    assert hb.stale() == [Stale("sender", 6.0, 5.0)]
    b.done()
    assert hb.stale() == []


def test_a_bound_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        Heartbeats().loop("x", 0)
