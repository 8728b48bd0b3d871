"""``python -m loadtest render-benchmarks``: docs/benchmarks.md's table from the recorded
reports (loadtest/reports/*.json, written by a command's ``--record``); ``--check`` says
whether the page is current instead of writing it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from loadtest.harness import benchpage
from loadtest.harness.contract import REPORTS

HELP = "docs/benchmarks.md's table from loadtest/reports/*.json (--check: only compare)"
PAGE = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--reports", type=Path, default=REPORTS, help="the recorded reports")
    p.add_argument("--page", type=Path, default=PAGE, help="the page whose table is replaced")
    p.add_argument("--check", action="store_true", help="exit 1 when the page differs; write nothing")


async def main(ns: argparse.Namespace) -> int:
    page = ns.page.read_text(encoding="utf-8")
    fresh = benchpage.render(page, benchpage.reports(ns.reports))
    if ns.check:
        if fresh != page:
            print(
                f"{ns.page} is not what the reports give: run python -m loadtest render-benchmarks",
                file=sys.stderr,
            )
            return 1
        print(f"{ns.page} is current")
        return 0
    ns.page.write_text(fresh, encoding="utf-8")
    print(f"{ns.page}: {len(benchpage.reports(ns.reports))} reports")
    return 0
