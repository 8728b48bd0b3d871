"""What text an operator's command or form may carry (gateway.core.operator_input)."""

from __future__ import annotations

import pytest

from gateway.core.operator_input import text_problem


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("ok", None),
        ("é, 漢字, emoji 🙂, a/b?c#d&e=%2F", None),
        ("bot\n", "control"),
        ("bot\r", "control"),
        ("a\x00b", "control"),
        ("tab\there", "control"),
        ("\x1b[31mred", "control"),
        ("\x85next line", "control"),
        ("\udcff", "UTF-8"),
        ("x" * 100, None),
        ("x" * 101, "longer than 100"),
    ],
)
def test_text_problems(value: str, problem: str | None) -> None:
    found = text_problem(value, 100)
    assert (found is None) if problem is None else (found is not None and problem in found)
    assert found is None or value not in found
