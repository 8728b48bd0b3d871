"""No committed load-test report holds a secret the harness knows of (its default secrets, or
a password inside a database URL)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from loadtest.harness.processes import DEFAULT_SECRETS

REPORTS = sorted((Path(__file__).parents[2] / "loadtest" / "reports").glob("*.*"))
_URL_PASSWORD = re.compile(r"[a-z][a-z0-9+.-]*://[^:/@\s\"]*:(?!\*\*\*@)[^@\s\"]+@")


@pytest.mark.parametrize(
    "path", [p for p in REPORTS if p.suffix in (".json", ".html", ".txt")], ids=lambda p: p.name
)
def test_committed_report_holds_no_secret(path: Path) -> None:
    text = path.read_text(errors="replace")
    for secret in (DEFAULT_SECRETS.meta, DEFAULT_SECRETS.tenashi):
        assert secret not in text
    assert not _URL_PASSWORD.search(text)
