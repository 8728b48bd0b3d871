import pytest

from gateway.core.backoff import backoff_delay


@pytest.mark.parametrize(
    ("attempt", "rand", "expected"),
    [
        (1, 0.0, 0.5),
        (1, 1.0, 1.0),
        (2, 0.0, 1.0),
        (3, 1.0, 4.0),
        (10, 1.0, 60.0),  # capped
        (10, 0.0, 30.0),
        (500, 0.5, 45.0),  # no overflow for huge attempts
    ],
)
def test_backoff_table(attempt: int, rand: float, expected: float) -> None:
    assert backoff_delay(attempt, 1.0, 60.0, lambda: rand) == pytest.approx(expected)


def test_backoff_rejects_zero_attempt() -> None:
    with pytest.raises(ValueError):
        backoff_delay(0, 1.0, 60.0)
