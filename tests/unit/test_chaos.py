import math

import pytest

from loadtest.harness import poison
from loadtest.harness.chaoskit import TENANT, outage_figures, send_checks


def rec(cb: str, to: str, at: float) -> dict[str, object]:
    return {"callback_data": cb, "to": to, "at": at}


@pytest.mark.parametrize(
    ("received", "outbox", "accepted", "failing"),
    [
        (
            [rec(f"{TENANT}:a", "1", 0.0), rec(f"{TENANT}:b", "1", 2.0)],
            {f"{TENANT}:a": "accepted", f"{TENANT}:b": "accepted"},
            {"a", "b"},
            set(),
        ),
        (
            [rec(f"{TENANT}:a", "1", 0.0), rec(f"{TENANT}:a", "2", 5.0)],
            {f"{TENANT}:a": "accepted"},
            {"a"},
            {"sends: each row sent at most once"},
        ),
        ([rec("other:x", "1", 0.0)], {}, set(), {"sends: nothing received without its row"}),
        ([], {}, {"lost"}, {"sends: every 202 in the outbox"}),
        (
            [rec(f"{TENANT}:a", "1", 0.0), rec(f"{TENANT}:b", "1", 1.0)],
            {f"{TENANT}:a": "accepted", f"{TENANT}:b": "accepted"},
            set(),
            {"sends: pair interval kept"},
        ),
        (
            [rec(f"{TENANT}:a", "1", 0.0), rec(f"{TENANT}:b", "2", 0.1)],
            {f"{TENANT}:a": "accepted", f"{TENANT}:b": "accepted"},
            set(),
            set(),
        ),
    ],
)
def test_send_checks(
    received: list[dict[str, object]], outbox: dict[str, str], accepted: set[str], failing: set[str]
) -> None:
    checks, _ = send_checks(received, outbox, accepted, 2.0)
    assert {c.name for c in checks if not c.ok} == failing


def test_outage_figures_count_503s_until_the_first_200_after_the_restart() -> None:
    answers = [(0.5, 200), (1.5, 503), (2.0, 503), (3.5, 503), (4.2, 200), (4.5, 503)]
    n503, other, first = outage_figures(answers, [1.2, 5.0], stopped=1.0, started=3.0)
    assert (n503, other) == (3, 1)
    assert first == pytest.approx(1.2)
    n503, _, first = outage_figures([(2.0, 503)], [], stopped=1.0, started=3.0)
    assert n503 == 1 and math.isnan(first)


def test_poison_checks_want_exactly_the_poisoned_fragments_dead() -> None:
    a, b, other = b"a" * 32, b"b" * 32, b"c" * 32
    expected = {a: ("message",), b: ("bad",), b"t" * 32: ()}
    good = [(a, "message", "dead"), (b, "bad", "dead")]
    assert all(c.ok for c in poison.checks(expected, good, 0))
    failing = {
        "missing": (
            [(a, "message", "dead")],
            0,
            {"poison: each poisoned fragment is a dead item, with its bytes"},
        ),
        "retrying": (
            [(a, "message", "retry"), (b, "bad", "dead")],
            0,
            {
                "poison: each poisoned fragment is a dead item, with its bytes",
                "poison: nothing else is dead or still retrying",
            },
        ),
        "stray": ([*good, (other, "status", "dead")], 0, {"poison: nothing else is dead or still retrying"}),
        "old partitions": (good, 2, {"maintenance: old partitions dropped once the forgotten session ended"}),
    }
    for name, (items, old, want) in failing.items():
        assert {c.name for c in poison.checks(expected, items, old) if not c.ok} == want, name
