"""docs/benchmarks.md's table, generated from the recorded reports (loadtest/reports/*.json,
written by ``--record``: loadtest.harness.contract): one line per target with the command that
measured it, the median of its rounds and whether it was met. The page's prose around the
table is written by hand; the table sits between two markers and is replaced whole."""

from __future__ import annotations

import shlex
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from loadtest.harness.contract import load, shown_argv

BEGIN = (
    "<!-- generated from loadtest/reports/*.json by `python -m loadtest render-benchmarks`; "
    "edit the reports (record a run), not this table -->"
)
END = "<!-- end of the generated table -->"


def reports(directory: Path) -> list[dict[str, Any]]:
    """Every recorded report, by key."""
    return sorted((load(p) for p in directory.glob("*.json")), key=lambda d: str(d["key"]))


def _number(v: float) -> str:
    """Three significant digits, thousands spaced (1 234/s reads better than 1.23e+03/s)."""
    if v != v:  # NaN
        return "-"
    if abs(v) >= 1000:
        return f"{v:,.0f}".replace(",", " ")
    return f"{v:.3g}"


def _value(t: dict[str, Any]) -> str:
    if t.get("value") is None:
        return "-"
    unit = str(t.get("unit") or "")
    out = f"**{_number(float(t['value']))}{unit}**"
    rounds = t.get("rounds") or []
    if len(rounds) > 1:
        out += " (" + " / ".join(_number(float(r)) for r in rounds) + ")"
    return out


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def rows(doc: dict[str, Any]) -> list[str]:
    """The report's lines of the table: one per target, one more when a check failed."""
    command = "`python -m loadtest " + shlex.join(shown_argv(doc["argv"])) + "`"
    when = str(doc.get("finished") or doc.get("started") or "")[:10]
    load = doc.get("load_average") or []
    measured = f"{when}, load {float(load[0]):.1f}" if load else when
    verdict = doc["verdict"]
    out = []
    for t in verdict.get("targets", []):
        goal = f"{t['op']} {_number(float(t['goal']))}{t.get('unit') or ''}"
        cells = (
            f"{t['name']} {goal}",
            command,
            _value(t),
            "met" if t["met"] else "**missed**",
            measured,
        )
        out.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    failed = verdict.get("failed_checks") or []
    if failed or not verdict.get("targets"):
        what = "; ".join(failed) if failed else "every check passed"
        cells = ("checks", command, what, "**failed**" if failed else "passed", measured)
        out.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return out


def table(docs: Iterable[dict[str, Any]]) -> str:
    lines = [
        "| target | command | median (rounds) | | measured |",
        "| --- | --- | --- | --- | --- |",
    ]
    for doc in docs:
        lines += rows(doc)
    return "\n".join(lines)


def render(page: str, docs: Iterable[dict[str, Any]]) -> str:
    """``page`` with the table between the markers replaced (ValueError without them)."""
    try:
        head, rest = page.split(BEGIN + "\n", 1)
        _, tail = rest.split(END, 1)
    except ValueError:
        raise ValueError(f"the page has no generated table between {BEGIN!r} and {END!r}") from None
    return f"{head}{BEGIN}\n{table(docs)}\n{END}{tail}"
