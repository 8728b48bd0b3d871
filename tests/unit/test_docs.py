"""The documentation stays true to the tree: every repository path README.md and docs/ name
exists, and docs/settings.md is what `gateway settings --markdown` prints."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted([ROOT / "README.md", ROOT / "loadtest" / "README.md", *(ROOT / "docs").glob("*.md")])
# Where a path in backticks is a path of this repository.
TOP = {p.name for p in ROOT.iterdir() if not p.name.startswith(".") or p.name == ".ci"} - {"var"}
# Made by running things, not kept in the repository.
GENERATED = ("loadtest/results", "deploy/.env")

_FENCE = re.compile(r"^```.*?^```", re.M | re.S)
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_CODE = re.compile(r"`([^`\s]+)`")


def named_paths(text: str, doc: Path) -> set[str]:
    """The repository paths a Markdown text names: link targets (relative to the document) and
    code spans that start with a top-level entry of the repository; ``<name>`` is a wildcard."""
    text = _FENCE.sub("", text)
    found: set[str] = set()
    for target in _LINK.findall(text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = (doc.parent / target.split("#")[0]).resolve()
        found.add(str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path))
    for span in _CODE.findall(text):
        span = span.rstrip(".,:;)").split("#")[0].split("::")[0]
        first = span.split("/")[0]
        if ("/" in span and first in TOP) or span in TOP:
            found.add(span)
    return found


def missing(path: str) -> bool:
    pattern = re.sub(r"<[^>]*>|NNNN", "*", path).rstrip("/")
    if pattern.startswith(GENERATED):
        return False
    return not any(ROOT.glob(pattern)) if "*" in pattern else not (ROOT / pattern).exists()


@pytest.mark.parametrize(
    ("text", "paths"),
    [
        (
            "see `gateway/core/settings.py` and [ops](docs/operations.md#metrics)",
            {"gateway/core/settings.py", "docs/operations.md"},
        ),
        (
            "`sql/functions/<name>.sql`, `GATEWAY_PORT`, `a/b`, [Meta](https://example.com/x)",
            {"sql/functions/<name>.sql"},
        ),
        ("```sh\ncat gateway/nope.py\n```\n`Makefile`", {"Makefile"}),
    ],
)
def test_named_paths(text: str, paths: set[str]) -> None:
    assert named_paths(text, ROOT / "README.md") == paths


def test_missing_is_false_for_real_paths_and_patterns() -> None:
    assert not missing("sql/functions/<name>.sql") and not missing("gateway/")
    assert missing("gateway/nowhere.py") and missing("sql/nowhere/<x>.sql")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_path_the_docs_name_exists(doc: Path) -> None:
    gone = sorted(p for p in named_paths(doc.read_text(encoding="utf-8"), doc) if missing(p))
    assert gone == [], f"{doc.relative_to(ROOT)} names paths that do not exist"


def test_the_settings_page_is_what_the_command_prints() -> None:
    from gateway.cli.processes import settings_markdown

    page = (ROOT / "docs" / "settings.md").read_text(encoding="utf-8")
    assert page == settings_markdown(), "regenerate it: gateway settings --markdown > docs/settings.md"
