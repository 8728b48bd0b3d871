"""How a failed group of events is split until the events at fault are alone."""

from __future__ import annotations

import math

import pytest

from gateway.core.narrowing import ONE_BY_ONE, narrow


@pytest.mark.parametrize(
    ("n", "failed_at", "expected"),
    [
        (1, None, (0, [])),
        (1, 0, (0, [])),
        (2, None, (None, [(0, 1), (1, 2)])),
        (ONE_BY_ONE, None, (None, [(i, i + 1) for i in range(ONE_BY_ONE)])),
        (ONE_BY_ONE + 1, None, (None, [(0, 4), (4, 9)])),
        (1000, None, (None, [(0, 500), (500, 1000)])),
        # A handler raised on a known event: it is at fault; the events before it go as one
        # part, those after it as one part, or two when there are many.
        (5, 0, (0, [(1, 5)])),
        (5, 2, (2, [(0, 2), (3, 5)])),
        (5, 4, (4, [(0, 4)])),
        (2, 1, (1, [(0, 1)])),
        (1000, 0, (0, [(1, 500), (500, 1000)])),
        (1000, 600, (600, [(0, 600), (601, 800), (800, 1000)])),
        (1000, 999, (999, [(0, 999)])),
    ],
)
def test_narrow(n: int, failed_at: int | None, expected: tuple[int | None, list[tuple[int, int]]]) -> None:
    assert narrow(n, failed_at) == expected


@pytest.mark.parametrize(("n", "failed_at"), [(0, None), (3, 3), (3, -1)])
def test_narrow_refuses_what_is_not_a_failed_group(n: int, failed_at: int | None) -> None:
    with pytest.raises(ValueError):
        narrow(n, failed_at)


def simulate(bad: set[int], n: int, *, known: bool) -> tuple[set[int], int, int, list[int]]:
    """Narrow a failed batch of ``n`` events of which ``bad`` fail: the events found at fault,
    the parts tried, the events those parts held in all, and the events applied, in order.
    ``known``: failures are handlers' (a part fails at its first bad event, which is named)."""
    found: set[int] = set()
    applied: list[int] = []
    tries = volume = 0

    def fail(start: int, end: int) -> None:
        first = min(bad & set(range(start, end)), default=None)
        at, parts = narrow(end - start, first - start if known and first is not None else None)
        if at is not None:
            found.add(start + at)
        for s, e in parts:
            attempt(start + s, start + e)

    def attempt(start: int, end: int) -> None:
        nonlocal tries, volume
        tries += 1
        volume += end - start
        if bad & set(range(start, end)):
            fail(start, end)
        else:
            applied.extend(range(start, end))

    fail(0, n)  # the fast path (the whole batch) failed
    return found, tries, volume, applied


CASES = [
    (1, {0}),
    (2, {1}),
    (7, {3}),
    (1000, {0}),
    (1000, {333}),
    (1000, {999}),
    (1000, {17, 18}),
    (64, {0, 31, 32, 63}),
    (10, set()),  # the failure was none of the events' (the rows around them): all go through
    (1000, set(range(1000))),
    (1000, set(range(0, 1000, 2))),
]


@pytest.mark.parametrize("known", [False, True], ids=["statement", "handler"])
@pytest.mark.parametrize(("n", "bad"), CASES)
def test_narrowing_finds_every_bad_event_and_applies_the_rest_once_in_order(
    n: int, bad: set[int], known: bool
) -> None:
    found, tries, volume, applied = simulate(bad, n, known=known)
    assert found == bad
    assert applied == [i for i in range(n) if i not in bad]
    # Never many more statements than going one by one, nor many more events applied than
    # halving does (n for each level).
    assert tries <= 1.3 * n
    assert volume <= n * max(1, math.ceil(math.log2(n)))
    if len(bad) == 1 and n > 1:
        # One bad event costs two tries per halving, not one per event.
        assert tries <= 2 * math.ceil(math.log2(n)) + ONE_BY_ONE
