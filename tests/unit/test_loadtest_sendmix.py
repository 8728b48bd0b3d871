"""The send mix of ``bench-send --mix`` and its figures (loadtest.harness.sendmix): table tests."""

from __future__ import annotations

import itertools
import random
from collections import Counter

import pytest

from loadtest.harness.sendmix import Sent, backlog_rate, due_times, inversions, lateness_ms, mix


def test_the_mix_a_fifth_of_the_customers_get_two_to_five() -> None:
    customers = mix(10_000, 0.2, 2, 5, random.Random(1))
    assert len(customers) == 10_000
    per = Counter(customers)
    repeat = [n for n in per.values() if n > 1]
    assert 0.17 < len(repeat) / len(per) < 0.23
    assert max(per.values()) <= 5
    # Spread through the stream, not each customer's messages in a run.
    assert sum(1 for a, b in itertools.pairwise(customers) if a == b) < 50


@pytest.mark.parametrize(
    ("order", "expected"),
    [
        ([(1, 0), (1, 1), (2, 2)], 0),
        ([(1, 1), (1, 0)], 1),  # the second overtook the first
        ([(1, 2), (1, 0), (1, 1)], 2),
        ([(1, 0), (2, 3), (2, 1), (1, 2)], 1),  # per customer
    ],
)
def test_inversions(order: list[tuple[int, int]], expected: int) -> None:
    assert inversions(order) == expected


@pytest.mark.parametrize(
    ("sends", "pair", "due"),
    [
        # a backlog: due from the first arrival; a customer's next one its interval after the last
        (
            [Sent(1, 10.0, 0), Sent(2, 10.5, 0), Sent(1, 16.2, 0)],
            6.0,
            [(10.0, False), (10.0, False), (16.0, True)],
        ),
        # enqueued after the wait ended: due from its enqueue, not held back
        ([Sent(1, 10.0, 10.0), Sent(1, 30.1, 30.0)], 6.0, [(10.0, False), (30.0, False)]),
        # the pair limit off
        ([Sent(1, 10.0, 0), Sent(1, 10.3, 0)], 0.0, [(10.0, False), (10.0, False)]),
    ],
)
def test_due_times(sends: list[Sent], pair: float, due: list[tuple[float, bool]]) -> None:
    got = due_times(sends, pair)
    assert [t for t, _ in got] == pytest.approx([t for t, _ in due])
    assert [held for _, held in got] == [held for _, held in due]


def test_lateness_counts_only_what_the_pair_held_back() -> None:
    sends = [Sent(1, 10.0, 0), Sent(1, 16.25, 0), Sent(2, 40.0, 39.0)]
    assert lateness_ms(sends, 6.0) == pytest.approx([250.0])


def test_backlog_rate_counts_the_time_a_backlog_waited() -> None:
    # Ten messages due at 0 leave one per second: a backlog of >= 3 for the first 8 s.
    drain = [Sent(i, float(i + 1), 0) for i in range(10)]
    drain[0] = Sent(0, 0.0, 0)
    rate, seconds = backlog_rate(drain, 0.0, 3)
    assert seconds == pytest.approx(8.0) and rate == pytest.approx(1.0)
    # A held-back message trickling out after the drain is not backlog time.
    rate2, seconds2 = backlog_rate([*drain, Sent(9, 16.1, 0)], 6.0, 3)
    assert (rate2, seconds2) == pytest.approx((rate, seconds))
    # Messages due but not sent for 5 s (a sender holding them back): that time counts.
    stalled = [Sent(0, 0.0, 0)] + [Sent(i, 5.0 + i, 0) for i in range(1, 10)]
    assert backlog_rate(stalled, 0.0, 3) == pytest.approx((8 / 12, 12.0))  # 8 sent in 12 s, not 1/s
