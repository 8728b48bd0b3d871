"""Spacing of woken steps (gateway.core.spacing)."""

from __future__ import annotations

import math

import pytest

from gateway.core.settings import Settings
from gateway.core.spacing import Rate, Senders, Spacing, linger
from gateway.inbound.consumer import consumer_spacing


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


@pytest.mark.parametrize(
    ("reports", "now", "gap"),
    [
        ([], 10.0, 0.030),  # nothing counted yet: the whole gap
        ([(10.0, 0)], 10.0, 0.030),  # steps that brought nothing
        ([(10.0, 300)], 10.0, 0.030),  # 300/s: 10 items take 33 ms, more than the most
        ([(10.0, 1000)], 10.0, 0.010),  # 1 000/s: 10 ms
        ([(9.0, 500), (10.0, 500)], 10.0, 10 / (500 + 500 * math.exp(-1))),  # the older decays
        ([(10.0, 1000)], 11.0, 10 / (1000 * math.exp(-1))),  # a window of quiet decays it
        ([(10.0, 1000)], 20.0, 0.030),  # long quiet: back to the most
        ([(10.0, 100_000)], 10.0, 0.0001),  # a flood: batches fill long before any gap
    ],
)
def test_the_gap_is_the_time_the_recent_rate_takes_to_gather(
    reports: list[tuple[float, int]], now: float, gap: float
) -> None:
    s = Spacing(0.030, gather=10, window_s=1.0)
    for at, items in reports:
        s.counted(at, items)
    assert s.gap(now) == pytest.approx(gap, rel=1e-6)


def test_gather_zero_keeps_the_gap_whatever_the_rate() -> None:
    s = Spacing(0.030, gather=0)
    s.counted(10.0, 100_000)
    assert s.gap(10.0) == 0.030
    assert [s.reserve(10.0), s.reserve(10.0)] == pytest.approx([0.0, 0.030])


def test_at_a_high_rate_woken_steps_wait_less() -> None:
    s = Spacing(0.030, gather=10)
    assert [s.reserve(10.0), s.reserve(10.001)] == pytest.approx([0.0, 0.029])
    s.counted(10.05, 2000)  # 2 000/s: a 5 ms gap (a little more 50 ms later, decayed)
    assert [s.reserve(10.1), s.reserve(10.1)] == pytest.approx([0.0, 10 / (2000 * math.exp(-0.05))])


@pytest.mark.parametrize(
    ("rate", "most", "gather", "wait"),
    [
        (0.0, 0.004, 2, 0.0),  # quiet: nobody to wait for
        (100.0, 0.004, 2, 0.0),  # 0.4 rows expected in 4 ms: waiting buys nothing
        (125.0, 0.004, 2, 0.004),  # half a row expected: the whole 4 ms
        (300.0, 0.004, 2, 0.004),  # two more take 6.7 ms: the most
        (1000.0, 0.004, 2, 0.002),  # two more take 2 ms
        (5000.0, 0.004, 2, 0.0004),
        (5000.0, 0.0, 2, 0.0),  # lingering off
        # the defaults (GATEWAY_COMMIT_LINGER_MS 12, GATEWAY_COMMIT_LINGER_GATHER 4)
        (40.0, 0.012, 4, 0.0),  # 0.48 rows expected in 12 ms
        (42.0, 0.012, 4, 0.012),
        (300.0, 0.012, 4, 0.012),  # four more take 13.3 ms: the most
        (1000.0, 0.012, 4, 0.004),
        (5000.0, 0.012, 4, 0.0008),
    ],
)
def test_a_lone_item_lingers_only_when_the_rate_brings_company(
    rate: float, most: float, gather: int, wait: float
) -> None:
    assert linger(rate, most, gather) == pytest.approx(wait)


def test_a_rate_is_a_decayed_count() -> None:
    r = Rate(window_s=1.0)
    assert r.at(5.0) == 0.0
    r.counted(5.0, 300)
    r.counted(5.0, 100)
    assert r.at(5.0) == pytest.approx(400.0)
    assert r.at(6.0) == pytest.approx(400.0 * math.exp(-1))
    assert r.at(4.0) == pytest.approx(400.0)  # a clock read before the last count: no growth


@pytest.mark.parametrize(
    ("rate", "least", "gap"),
    [
        (300, 0.010, 0.030),  # 10 events take 33 ms: the most
        (640, 0.010, 10 / 640),  # 15.6 ms: the gather's time, between the bounds
        (3000, 0.010, 0.010),  # 3.3 ms would make small batches near saturation: the least
        (3000, 0.0, 10 / 3000),  # no least: the gather's time
        (3000, 0.050, 0.030),  # a least above the most counts as the most
    ],
)
def test_the_gap_never_falls_below_the_least(rate: int, least: float, gap: float) -> None:
    s = Spacing(0.030, gather=10, least_s=least)
    s.counted(10.0, rate)
    assert s.gap(10.0) == pytest.approx(gap, rel=1e-6)


def test_the_consumers_spacing_is_the_settings() -> None:
    s = consumer_spacing(
        Settings.from_env(
            {
                "GATEWAY_CONSUMER_BATCH_GAP_MS": "40",
                "GATEWAY_CONSUMER_BATCH_GAP_MIN_MS": "12",
                "GATEWAY_CONSUMER_BATCH_GATHER": "20",
            }
        )
    )
    assert (s.most, s.least, s.gather) == pytest.approx((0.040, 0.012, 20))
    assert consumer_spacing(Settings()).least == pytest.approx(0.010)


@pytest.mark.parametrize(
    ("items", "at", "several"),
    [
        ([], 0.5, False),  # nobody yet
        ([(0.0, 1)], 0.5, True),  # a first sender is a change of sender
        ([(0.0, 1)], 1.0, False),  # ... for a second
        ([(0.0, 1), (0.6, 1), (0.9, 1)], 1.2, False),  # one connection alone for over a second
        ([(0.0, 1), (0.9, 2)], 1.5, True),  # another connection 0.6 s ago
        ([(0.0, 1), (0.9, 2), (1.0, 2)], 1.8, True),  # its next item is no change, its first was
        ([(0.0, 1), (0.9, 2), (1.0, 2)], 2.0, False),
        ([(0.0, 1), (0.9, 1), (1.5, None)], 2.0, True),  # unknown: as if another were sending
        ([(0.0, None), (0.9, None)], 1.8, True),  # unknown twice is two changes
    ],
)
def test_several_senders_means_another_within_the_window(
    items: list[tuple[float, int | None]], at: float, several: bool
) -> None:
    senders = Senders(1.0)
    for now, sender in items:
        senders.seen(now, sender)
    assert senders.several(at) is several
