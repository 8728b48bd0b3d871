"""Command-line options the load commands share."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

# Results of every command, git-ignored.
RESULTS = Path(__file__).resolve().parents[1] / "results"


def add_common_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seed", type=int, default=1, help="payload RNG seed (ids stay unique per run)")
    p.add_argument("--connections", type=int, default=512, help="max keep-alive connections")
    p.add_argument("--timeout", type=float, default=10.0, help="per-request timeout, seconds")
    p.add_argument("--quiet", action="store_true", help="no progress line")
    p.add_argument(
        "--database-url",
        default=os.environ.get("DATABASE_URL"),
        help="self-contained: use this PostgreSQL instead of a temporary embedded one; "
        "--url mode: where to verify (default $DATABASE_URL)",
    )
