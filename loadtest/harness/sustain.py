"""The highest webhook rate a pipeline sustains, found by bisection over open-load probes.

A probe sends webhooks at one rate for a few seconds and then counts the work left undone
(events staged but not processed, deliveries not yet delivered). The pipeline kept up when
that is at most ``slack_s`` seconds of the probe's input: a pipeline that keeps up holds a
backlog of about its latency times the rate, one that does not grows it by the overload for
every second of the probe.

Pure: the caller runs each probe and records its outcome; ``Search`` says which rate to try
next (the geometric middle of the rates known kept up and not) and when it knows enough.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

SLACK_S = 0.25


@dataclass(frozen=True, slots=True)
class Probe:
    rate: float
    backlog: float  # events left undone when the load ended (deliveries counted per destination)
    errors: int = 0  # webhooks not acknowledged

    def kept_up(self, slack_s: float = SLACK_S) -> bool:
        return self.errors == 0 and self.backlog <= self.rate * slack_s


@dataclass(slots=True)
class Search:
    """Bisection between ``lo`` (assumed sustained) and ``hi`` (assumed not)."""

    lo: float
    hi: float
    tolerance: float = 0.1  # done when hi <= lo * (1 + tolerance)
    max_probes: int = 8
    slack_s: float = SLACK_S
    probes: list[Probe] = field(default_factory=list)

    def next_rate(self) -> float | None:
        """The rate to probe next; None when the search is done."""
        if len(self.probes) >= self.max_probes or self.hi <= self.lo * (1 + self.tolerance):
            return None
        return float(round(math.sqrt(self.lo * self.hi)))

    def record(self, probe: Probe) -> None:
        self.probes.append(probe)
        if probe.kept_up(self.slack_s):
            self.lo = max(self.lo, probe.rate)
        else:
            self.hi = min(self.hi, probe.rate)

    @property
    def sustained(self) -> float:
        """The highest rate a probe kept up at (0: none did)."""
        return max((p.rate for p in self.probes if p.kept_up(self.slack_s)), default=0.0)
