"""The tests' HTTP helpers live once, in tests/support/: no test module defines its own POST
helper or CLI runner, or writes out a tenant's API key header (tests/support/http.py has
``ACME``, ``GLOBEX``, ``post_message``, ``post_meta``; tests/support/procs.py has ``run_cli``)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support.config import API_KEYS

TESTS = Path(__file__).resolve().parents[1]
# The names a copy of a shared helper goes by.
HELPERS = {"post", "post_message", "post_message_json", "post_meta", "run_cli", "url"}
# A tenant's API key, alone or as its Authorization header's value.
KEYS = {text for _, key in API_KEYS for text in (key, f"Bearer {key}")}


def own_copies(source: str) -> list[str]:
    """What a test module defines or writes out that tests/support already has."""
    tree = ast.parse(source)
    found = [
        f"def {node.name}"
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name in HELPERS
    ]
    found += [
        f"key {node.value[:12]}…"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and node.value in KEYS
    ]
    return found


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ('ACME = {"Authorization": "Bearer acme-api-key-0123456789"}', ["key Bearer acme-…"]),
        ('h = {"Authorization": f"Bearer globex-api-key-0123456789"}', ["key Bearer globe…"]),
        ("async def post(http, gw, body, key):\n    pass", ["def post"]),
        ("async def post_meta(http, gw, body):\n    pass", ["def post_meta"]),
        ("def run_cli(*args, env):\n    pass", ["def run_cli"]),
        # A local closure with its own logic over the shared helpers is not a copy.
        ("async def test_x():\n    async def post(body):\n        pass", []),
        ("from tests.support.http import ACME, post_message", []),
        ('API_KEY = "acme-api-key-0123456789"', ["key acme-api-key…"]),
        ('BEARER = {"Authorization": "Bearer t"}', []),  # the fake provider's token, not an API key
        ('WRONG = {"Authorization": "Basic acme-api-key-0123456789"}', []),  # a wrong scheme, on purpose
    ],
)
def test_the_rule_catches_what_it_should(source: str, expected: list[str]) -> None:
    assert own_copies(source) == expected


def test_no_test_module_has_its_own_http_helpers() -> None:
    offenders = {
        str(path.relative_to(TESTS)): found
        for path in sorted(TESTS.rglob("test_*.py"))
        if path.parent.name != "compose"  # the bundle's test runs with the bundle's own keys
        if (found := own_copies(path.read_text(encoding="utf-8")))
    }
    assert offenders == {}, "use tests/support/http.py (headers, POSTs) and tests/support/procs.py (run_cli)"
