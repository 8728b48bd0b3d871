"""``python -m loadtest``: load runs and the benchmarks, one subcommand each."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from gateway.runtime import install_uvloop, setup_logging


def _asyncio(
    main: Callable[[argparse.Namespace], Coroutine[Any, Any, int]],
) -> Callable[[argparse.Namespace], int]:
    def run(ns: argparse.Namespace) -> int:
        import asyncio

        install_uvloop()
        return asyncio.run(main(ns))

    return run


def build_parser() -> argparse.ArgumentParser:
    from loadtest import bench_growth, bench_ingest, chaos, run

    parser = argparse.ArgumentParser(prog="python -m loadtest", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", help="open-model load against the gateway, then verify and report")
    run.add_args(p)
    p.set_defaults(func=_asyncio(run.main))
    p = sub.add_parser("chaos", help="kill and restart every part, PostgreSQL included, under load; verify")
    chaos.add_args(p)
    p.set_defaults(func=_asyncio(chaos.main))
    p = sub.add_parser("bench-ingest", help="gateway vs bare verify-only vs insert-per-request handler")
    bench_ingest.add_args(p)
    p.set_defaults(func=_asyncio(bench_ingest.main))
    from loadtest import verify_cli

    p = sub.add_parser("verify", help="exactly-once verification of a run driven by another tool (Locust)")
    verify_cli.add_args(p)
    p.set_defaults(func=_asyncio(verify_cli.main))
    p = sub.add_parser("render", help="redact a saved result JSON and re-draw its HTML page beside it")
    p.add_argument("json", type=Path, nargs="+", help="result files written by run or bench-ingest")
    p.set_defaults(func=_render)
    p = sub.add_parser("bench-growth", help="throughput as the dedup table grows; DROP vs DELETE retention")
    bench_growth.add_args(p)
    p.set_defaults(func=bench_growth.main)
    from loadtest import bench_console

    p = sub.add_parser("bench-console", help="every console page's time with 1 M dead items, 10 M sends")
    bench_console.add_args(p)
    p.set_defaults(func=bench_console.main)
    for name, what in (
        ("bench-consumers", "the consumer benchmark"),
        ("bench-send", "the send benchmark"),
        ("bench-forward", "the forwarder benchmark"),
    ):
        p = sub.add_parser(name, help=f"{what} (arguments after the name go to it)", add_help=False)
    return parser


def _render(ns: argparse.Namespace) -> int:
    from loadtest import report

    for path in ns.json:
        jpath, hpath, verdict = report.render(path)
        print(f"{jpath}\n{hpath}\n{verdict.summary()}")
    return 0


def _bench(name: str) -> Callable[[list[str]], int]:
    from loadtest import bench_consumers, bench_forward, bench_send

    mains: dict[str, Callable[[list[str]], int]] = {
        "bench-consumers": bench_consumers.main,
        "bench-send": bench_send.main,
        "bench-forward": bench_forward.main,
    }
    return mains[name]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    setup_logging("WARNING")
    parser = build_parser()
    if argv and argv[0] in ("bench-consumers", "bench-send", "bench-forward"):
        return _bench(argv[0])(argv[1:])
    ns = parser.parse_args(argv)
    code: int = ns.func(ns)
    return code
