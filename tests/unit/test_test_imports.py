"""Tests share helpers only through tests/support/: no test imports conftest (pytest loads it
itself, and importing it a second time makes a second copy of its fixtures) or another test
module (a test file's helpers then change with that file's tests)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]


def _is_test_code(name: str) -> bool:
    parts = name.split(".")
    if len(parts) == 1:  # a test directory is on sys.path: its modules import bare
        return name == "conftest" or name.startswith("test_")
    return parts[0] == "tests" and parts[1] != "support"


def forbidden_imports(path: Path) -> list[str]:
    """The imports in ``path`` of a test module or conftest, named as written."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            bad += [alias.name for alias in node.names if _is_test_code(alias.name)]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative imports: only tests/support, among its own modules
                if path.parent.name != "support":
                    bad.append("." * node.level + base)
            elif _is_test_code(base):
                bad.append(base)
            elif base == "tests":
                bad += [f"tests.{alias.name}" for alias in node.names if _is_test_code(f"tests.{alias.name}")]
    return bad


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from tests.conftest import META_SECRET", ["tests.conftest"]),
        ("import conftest", ["conftest"]),
        ("from tests.integration.test_consumer import cli", ["tests.integration.test_consumer"]),
        ("from tests.unit import test_subject", ["tests.unit"]),
        ("from tests import procs", ["tests.procs"]),
        ("import tests.sendkit", ["tests.sendkit"]),
        ("from . import helpers", ["."]),
        ("from tests.support.config import META_SECRET", []),
        ("from tests.support import handlers", []),
        ("from gateway.testing.payloads import to_bytes", []),
        ("from aiohttp.test_utils import TestServer", []),
        ("from test_consumer import cli", ["test_consumer"]),
    ],
)
def test_the_rule_catches_what_it_should(tmp_path: Path, source: str, expected: list[str]) -> None:
    path = tmp_path / "test_x.py"
    path.write_text(source + "\n")
    assert forbidden_imports(path) == expected


def test_no_test_imports_conftest_or_another_test_module() -> None:
    offenders = {
        str(path.relative_to(TESTS)): bad
        for path in sorted(TESTS.rglob("*.py"))
        if (bad := forbidden_imports(path))
    }
    assert offenders == {}, "import shared helpers from tests/support/ instead"
