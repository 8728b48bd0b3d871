"""``python -m loadtest``: load runs and the benchmarks, one subcommand each."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from gateway.cli import install_uvloop, setup_logging


def _delegate(module: str, what: str) -> Callable[[list[str]], int]:
    """Run ``loadtest.<module>.main(argv)``, written on another branch; say so if it has not landed."""

    def run(argv: list[str]) -> int:
        try:
            mod = importlib.import_module(f"loadtest.{module}")
        except ModuleNotFoundError as exc:
            if exc.name != f"loadtest.{module}":
                raise
            print(
                f"{what} is not available yet: loadtest/{module}.py has not landed on this branch",
                file=sys.stderr,
            )
            return 2
        result: int = mod.main(argv)
        return result

    return run


def _asyncio(
    main: Callable[[argparse.Namespace], Coroutine[Any, Any, int]],
) -> Callable[[argparse.Namespace], int]:
    def run(ns: argparse.Namespace) -> int:
        import asyncio

        install_uvloop()
        return asyncio.run(main(ns))

    return run


def build_parser() -> argparse.ArgumentParser:
    from loadtest import bench_ingest, run

    parser = argparse.ArgumentParser(prog="python -m loadtest", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", help="open-model load against the gateway, then verify and report")
    run.add_args(p)
    p.set_defaults(func=_asyncio(run.main))
    p = sub.add_parser("bench-ingest", help="gateway vs bare verify-only vs insert-per-request handler")
    bench_ingest.add_args(p)
    p.set_defaults(func=_asyncio(bench_ingest.main))
    for name, module, what in (
        ("bench-consumers", "bench_consumers", "the consumer benchmark"),
        ("bench-send", "bench_send", "the send benchmark"),
    ):
        p = sub.add_parser(name, help=f"{what} (arguments after the name go to it)", add_help=False)
        p.set_defaults(delegate=_delegate(module, what))
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    setup_logging("WARNING")
    parser = build_parser()
    if argv and argv[0] in ("bench-consumers", "bench-send"):
        ns = parser.parse_args(argv[:1])
        code: int = ns.delegate(argv[1:])
        return code
    ns = parser.parse_args(argv)
    code = ns.func(ns)
    return code
