import pytest

from gateway.core.limits import ByteBudget, LogThrottle


@pytest.mark.parametrize(
    ("limit", "steps", "in_use"),
    [
        # (action, size, expected result of take or None for release)
        (10, [("take", 4, True), ("take", 6, True), ("take", 1, False)], 10),
        (10, [("take", 11, False)], 0),
        (10, [("take", 10, True), ("release", 10, None), ("take", 10, True)], 10),
        (10, [("take", 3, True), ("take", 8, False), ("take", 7, True)], 10),
        (10, [("release", 5, None), ("take", 10, True)], 10),  # never below zero
        (0, [("take", 0, True), ("take", 1, False)], 0),
    ],
)
def test_byte_budget(limit: int, steps: list[tuple[str, int, bool | None]], in_use: int) -> None:
    b = ByteBudget(limit)
    for action, n, want in steps:
        if action == "take":
            assert b.take(n) is want
        else:
            b.release(n)
    assert b.in_use == in_use


def test_byte_budget_refuses_negative() -> None:
    with pytest.raises(ValueError):
        ByteBudget(1).take(-1)


@pytest.mark.parametrize(
    ("calls", "want"),
    [
        # (key, now) -> None (held) or count held back before this line
        ([("a", 0.0), ("a", 1.0), ("a", 9.9), ("a", 10.0)], [0, None, None, 2]),
        ([("a", 0.0), ("b", 0.1), ("a", 0.2), ("b", 10.1)], [0, 0, None, 0]),
        ([("a", 5.0), ("a", 15.0), ("a", 25.0)], [0, 0, 0]),
        (
            [("a", 0.0)] + [("a", 0.001 * i) for i in range(1, 2000)] + [("a", 10.0)],
            [0] + [None] * 1999 + [1999],
        ),
    ],
)
def test_log_throttle(calls: list[tuple[str, float]], want: list[int | None]) -> None:
    t = LogThrottle(10.0)
    assert [t.allow(key, now) for key, now in calls] == want


def test_log_throttle_suffix() -> None:
    assert LogThrottle.suffix(0) == ""
    assert "3 more" in LogThrottle.suffix(3)
