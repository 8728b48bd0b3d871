"""``python -m loadtest``: load runs, benchmarks and their tools, one subcommand each.

Every command is a module of this package with the same three names: ``HELP`` (its line in
``--help``), ``add_args(parser)`` and ``async main(ns) -> int`` (the exit status: non-zero
when a check fails or a target is missed). Those that measure hand their figures, targets
and checks to loadtest.harness.contract, which judges, prints and writes them. ``COMMANDS``
is the one list of them: loadtest/README.md's layout and the import-linter contract for
loadtest (pyproject.toml) are tested against it. The library they share is loadtest.harness."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import signal
import sys
from types import ModuleType

from gateway.runtime.logs import setup_logging
from gateway.runtime.process import install_uvloop
from loadtest.harness import contract

COMMANDS = (
    "run",
    "chaos",
    "bench-ingest",
    "bench-consumers",
    "bench-citus",
    "bench-send",
    "bench-forward",
    "bench-graph",
    "bench-pipeline",
    "bench-growth",
    "bench-access",
    "bench-console",
    "verify",
    "render",
    "render-benchmarks",
)


def module_name(name: str) -> str:
    """The module of a command: ``bench-ingest`` -> ``bench_ingest``."""
    return name.replace("-", "_")


def command(name: str) -> ModuleType:
    return importlib.import_module(f"loadtest.{module_name(name)}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m loadtest", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        module = command(name)
        p = sub.add_parser(
            name,
            help=module.HELP,
            description=module.__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        module.add_args(p)
        contract.add_args(p)
        p.set_defaults(main=module.main, command=name)
    return parser


def main(argv: list[str] | None = None) -> int:
    setup_logging("WARNING")
    args = sys.argv[1:] if argv is None else argv
    ns = build_parser().parse_args(args)
    ns.argv = list(args)
    install_uvloop()
    code: int = asyncio.run(_until_terminated(ns))
    return code


async def _until_terminated(ns: argparse.Namespace) -> int:
    """The command, cancelled by SIGTERM: its ``finally`` blocks then stop what it started (a
    gateway in a session of its own would otherwise outlive a run that is terminated)."""
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        code: int = await ns.main(ns)
    except asyncio.CancelledError:
        print("loadtest: terminated (SIGTERM); what it started is stopped", file=sys.stderr)
        return 128 + signal.SIGTERM
    finally:
        # What it started is stopped by now: a SIGTERM while asyncio.run shuts down (a task
        # that does not end) terminates the process, as it would without the handler.
        loop.remove_signal_handler(signal.SIGTERM)
    return code
