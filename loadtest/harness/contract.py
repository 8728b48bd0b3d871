"""The contract of every ``python -m loadtest`` command: it hands what it measured (figures,
targets, checks) to one ``Run``, which judges it (``report.Verdict``), prints the verdict
after the figures, writes the result (``--results``: JSON and its page) and gives the exit
status: 0 when every target is met and every check passed, 1 otherwise.

``--record`` also writes the result as the command's current report,
``loadtest/reports/<key>.json``; docs/benchmarks.md is generated from those reports
(``python -m loadtest render-benchmarks``, loadtest.harness.benchpage).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from loadtest.harness import report
from loadtest.harness.options import RESULTS
from loadtest.harness.redact import redact_text

REPORTS = Path(__file__).resolve().parents[1] / "reports"
# Options that say where a result goes or how progress shows, not what was measured: left out
# of the recorded command.
_PLACES = {"--results": 1, "--record": 0, "--quiet": 0}


def add_args(p: argparse.ArgumentParser) -> None:
    """The options every command has (added by loadtest.cli)."""
    p.add_argument("--results", type=Path, default=RESULTS, help="directory for the JSON/HTML results")
    p.add_argument(
        "--record",
        action="store_true",
        help="also write the result as the current report, loadtest/reports/<key>.json "
        "(docs/benchmarks.md is generated from those: python -m loadtest render-benchmarks)",
    )


def shown_argv(argv: Sequence[str]) -> list[str]:
    """The command's arguments without the options that only place its result."""
    out: list[str] = []
    skip = 0
    for a in argv:
        if skip:
            skip -= 1
            continue
        name = a.split("=", 1)[0]
        if name in _PLACES:
            skip = _PLACES[name] if "=" not in a else 0
            continue
        out.append(a)
    return out


def parameters(ns: argparse.Namespace) -> dict[str, Any]:
    """A command's options as JSON values (what ran is part of every result)."""
    out: dict[str, Any] = {}
    for k, v in vars(ns).items():
        if callable(v) or k in ("argv", "record"):
            continue
        out[k] = str(v) if isinstance(v, Path) else sorted(v) if isinstance(v, set | frozenset) else v
    return out


def load_line(start: Sequence[float], end: Sequence[float]) -> str:
    def fmt(avg: Sequence[float]) -> str:
        return " / ".join(f"{x:.2f}" for x in avg)

    cpus = os.cpu_count()
    return f"load average (1, 5, 15 min) at the start {fmt(start)}, at the end {fmt(end)} ({cpus} CPUs)"


class Run:
    """One run of a command: collects its targets and checks, then ``finish`` judges and writes.

    ``key`` names the report ``--record`` writes (the command's name unless a mode of it has
    targets of its own, e.g. ``bench-send-latency``)."""

    def __init__(self, ns: argparse.Namespace, key: str | None = None) -> None:
        self.ns = ns
        self.command: str = getattr(ns, "command", "") or "loadtest"
        self.key = key or self.command
        self.argv = shown_argv(getattr(ns, "argv", None) or [self.command])
        self.started = dt.datetime.now(dt.UTC)
        self.load_average = list(os.getloadavg())
        self.verdict = report.Verdict()
        self.figures: dict[str, Any] = {}  # what a command collects as it goes (finish adds its own)
        self.results: Path = getattr(ns, "results", None) or RESULTS
        self.stem = f"{getattr(ns, 'name', None) or self.key}-{self.started.astimezone():%Y%m%d-%H%M%S}"

    @property
    def log_dir(self) -> Path:
        """Where the logs of the processes this run starts go (made on first use)."""
        d = self.results / f"{self.stem}-logs"
        d.mkdir(parents=True, exist_ok=True)
        return d

    def target(self, target: report.Target) -> report.Target:
        self.verdict.targets.append(target)
        return target

    def median(
        self, name: str, rounds: Sequence[float], goal: float, op: str, unit: str = ""
    ) -> report.Target:
        """A target judged on the median of its rounds."""
        return self.target(report.Target.median(name, rounds, goal, op, unit))

    def check(self, name: str, ok: bool, detail: str = "") -> bool:
        """A correctness check: a failed one fails the run whatever the targets say."""
        if not ok:
            self.verdict.failed_checks.append(f"{name}: {detail}" if detail else name)
        return ok

    def note(self, text: str) -> None:
        self.verdict.notes.append(text)

    def finish(
        self,
        figures: dict[str, Any],
        text: str,
        charts: Sequence[str] = (),
        secrets: Iterable[str] = (),
        verdict: report.Verdict | None = None,
    ) -> int:
        """Print the figures and the verdict, write the result (and the report with
        ``--record``); the exit status. ``verdict``: one a command's own judge built from
        ``figures`` (so that a saved result can be judged again), instead of this run's."""
        if verdict is not None:
            verdict.targets = self.verdict.targets + verdict.targets
            verdict.failed_checks = self.verdict.failed_checks + verdict.failed_checks
            verdict.notes = self.verdict.notes + verdict.notes
            self.verdict = verdict
        after = list(os.getloadavg())
        lines = [text.rstrip(), "", load_line(self.load_average, after)]
        lines += [f"{'met   ' if t.met else 'MISSED'} {t.line()}" for t in self.verdict.targets]
        lines += [f"FAILED {c}" for c in self.verdict.failed_checks]
        shown = "\n".join(lines)
        print(redact_text(shown, {s for s in secrets if s}))
        result = {
            "command": self.command,
            "key": self.key,
            "argv": self.argv,
            "started": self.started.isoformat(timespec="seconds"),
            "finished": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "load_average": self.load_average,
            "load_average_after": after,
            "parameters": parameters(self.ns),
            **self.figures,
            **figures,
        }
        jpath, hpath = report.write(self.results, self.stem, result, shown, charts, self.verdict, secrets)
        print(f"\nresults: {jpath}\n         {hpath}")
        if getattr(self.ns, "record", False):
            REPORTS.mkdir(parents=True, exist_ok=True)
            kept = REPORTS / f"{self.key}.json"
            shutil.copyfile(jpath, kept)
            print(f"recorded: {kept}")
        print(self.verdict.summary())
        return 0 if self.verdict.passed else 1


def load(path: Path) -> dict[str, Any]:
    """A recorded report; ValueError when it is not one the contract wrote."""
    doc = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(doc, dict) or not {"command", "key", "argv", "verdict"} <= doc.keys():
        raise ValueError(f"{path}: not a report written by loadtest.harness.contract")
    return doc
