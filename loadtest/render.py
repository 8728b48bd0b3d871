"""``python -m loadtest render FILE.json``: a saved result (of run or bench-ingest) redacted
and its HTML page re-drawn beside it."""

from __future__ import annotations

import argparse
from pathlib import Path

from loadtest.harness import render

HELP = "redact a saved result JSON and re-draw its HTML page beside it"


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("json", type=Path, nargs="+", help="result files written by run or bench-ingest")


async def main(ns: argparse.Namespace) -> int:
    for path in ns.json:
        jpath, hpath, verdict = render.render(path)
        print(f"{jpath}\n{hpath}\n{verdict.summary()}")
    return 0
