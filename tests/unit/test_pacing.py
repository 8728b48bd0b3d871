import itertools

import pytest

from gateway.core.pacing import Pacer


@pytest.mark.parametrize(
    ("pair_s", "rate", "sends", "expected"),
    [
        # (number, recipient, t) -> wait; 0.0 means sent and booked
        (6.0, 100.0, [("n", "a", 0.0), ("n", "a", 1.0)], [0.0, 5.0]),
        (6.0, 100.0, [("n", "a", 0.0), ("n", "a", 6.0)], [0.0, 0.0]),
        (6.0, 100.0, [("n", "a", 0.0), ("n", "b", 0.0)], [0.0, 0.0]),  # other recipient
        (6.0, 100.0, [("n", "a", 0.0), ("m", "a", 0.0)], [0.0, 0.0]),  # other number: other pair
        (
            6.0,
            100.0,
            [("n", "a", 0.0), ("n", "a", 2.0), ("n", "a", 6.0)],
            [0.0, 4.0, 0.0],
        ),  # refusal books nothing
        (0.0, 2.0, [("n", "a", 0.0), ("n", "b", 0.0), ("n", "c", 0.0)], [0.0, 0.0, 0.5]),  # burst of 2
        (0.0, 2.0, [("n", "a", 0.0), ("n", "b", 0.0), ("n", "c", 0.5)], [0.0, 0.0, 0.0]),
        (0.0, 2.0, [("n", "a", 0.0), ("n", "b", 0.0), ("m", "c", 0.0)], [0.0, 0.0, 0.0]),  # per number
        (6.0, 1.0, [("n", "a", 0.0), ("n", "a", 0.5)], [0.0, 5.5]),  # the longer wait wins
    ],
)
def test_pacer_table(
    pair_s: float, rate: float, sends: list[tuple[str, str, float]], expected: list[float]
) -> None:
    p = Pacer(pair_s, rate)
    got = [p.try_acquire(n, r, t) for n, r, t in sends]
    assert got == pytest.approx(expected)


def test_ten_messages_to_one_recipient_are_six_seconds_apart() -> None:
    p = Pacer(6.0, 80.0)
    t, sent = 0.0, []
    while len(sent) < 10:
        wait = p.try_acquire("n", "a", t)
        if wait == 0:
            sent.append(t)
        else:
            t += wait
    assert all(b - a >= 6.0 for a, b in itertools.pairwise(sent))
    assert sent[-1] == pytest.approx(54.0)


def test_prune_keeps_recent_pairs_only() -> None:
    p = Pacer(6.0, 1e9, prune_min=100)
    for i in range(99):
        p.try_acquire("n", f"r{i}", 0.0)
    assert p.try_acquire("n", "r1", 1.0) > 0  # still remembered
    p.try_acquire("n", "late", 10.0)  # the 100th pair triggers a prune: the t=0 ones are past
    assert len(p._last_pair) == 1
    assert p.try_acquire("n", "late", 11.0) > 0  # the recent one is kept
