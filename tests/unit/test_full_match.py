"""Validation takes the whole input: a pattern that checks a value matches all of it (``$`` also
matches before a trailing newline, so ``re.match(r"^x$", "x\\n")`` passes), and a digit check
accepts ASCII digits only (``"²".isdigit()`` is true, and ``float("²")`` fails)."""

from __future__ import annotations

import argparse
import ast
import re
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gateway.cli.common import dead_id
from gateway.core import console, delivery_outcomes, destinations, stdwebhooks
from gateway.store.retention import _ddl
from gateway.web.access import request_id

ROOT = Path(__file__).resolve().parents[2]
NOW = datetime(2026, 12, 1, 12, tzinfo=UTC)


def _signature(msg_id: str) -> object:
    return stdwebhooks.signature(b"k" * 32, msg_id, 1, b"{}")


# (a check, a value it accepts): the same value with a newline, a NUL or a tab after it is refused.
CHECKS: list[tuple[str, Callable[[str], object], str]] = [
    ("destination name", destinations.check_name, "bot"),
    ("destination url", destinations.check_url, "https://bot.example/hooks"),
    ("webhook id", _signature, "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W"),
    ("partition name", lambda n: _ddl("partition_detach_now", parent="webhook_inbox", child=n),
     "webhook_inbox_p20261201"),
    ("dead id", dead_id, "E12"),
]  # fmt: skip


@pytest.mark.parametrize(("what", "check", "good"), CHECKS, ids=[c[0] for c in CHECKS])
@pytest.mark.parametrize("tail", ["\n", "\x00", "\t", "\n\n"])
def test_a_valid_value_with_anything_after_it_is_refused(
    what: str, check: Callable[[str], object], good: str, tail: str
) -> None:
    check(good)
    with pytest.raises((ValueError, argparse.ArgumentTypeError)):
        check(good + tail)


@pytest.mark.parametrize("given", ["abc\n", "abc\x00", "abc def", "x" * 129])
def test_a_request_id_header_is_used_only_when_all_of_it_is_sane(given: str) -> None:
    assert request_id("abc") == "abc"
    assert request_id(given) != given


@pytest.mark.parametrize("digits", ["²", "١٢", "12²", "\uff11\uff12"])
def test_only_ascii_digits_are_numbers(digits: str) -> None:
    assert delivery_outcomes.parse_retry_after(digits, 0) is None  # a receiver's Retry-After: hostile
    with pytest.raises(ValueError, match="not a time"):
        console.parse_when(f"{digits}h", NOW)
    with pytest.raises(argparse.ArgumentTypeError):
        dead_id(f"E{digits}")


def _patterns(tree: ast.AST) -> list[tuple[int, str, bool]]:
    """Every pattern literal given to re.compile/match/fullmatch/search: (line, pattern,
    whether re.MULTILINE is among its flags)."""
    found = []
    for node in ast.walk(tree):
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "re"
            and node.func.attr in ("compile", "match", "fullmatch", "search")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str | bytes)
        ):
            continue
        raw = node.args[0].value
        pattern = raw.decode("latin-1") if isinstance(raw, bytes) else raw
        multiline = "MULTILINE" in ast.dump(node) or "(?m" in pattern
        found.append((node.lineno, pattern, multiline))
    return found


def test_no_pattern_in_the_product_ends_with_a_dollar_anchor() -> None:
    """``$`` (outside MULTILINE, where it is meant per line) lets a trailing newline through:
    patterns that validate are full matches (``fullmatch``, or ``\\Z``)."""
    offenders = []
    for path in sorted((ROOT / "gateway").rglob("*.py")):
        for line, pattern, multiline in _patterns(ast.parse(path.read_text(), str(path))):
            if re.search(r"(?<!\\)\$\)?$", pattern) and not multiline:
                offenders.append(f"{path.relative_to(ROOT)}:{line}: {pattern!r}")
    assert offenders == []


def test_the_scan_sees_a_dollar_anchor() -> None:
    tree = ast.parse('import re\nA = re.compile(r"^[a-z]+$")\nB = re.compile(r"^x$", re.MULTILINE)\n')
    assert [(p, m) for _, p, m in _patterns(tree)] == [("^[a-z]+$", False), ("^x$", True)]
