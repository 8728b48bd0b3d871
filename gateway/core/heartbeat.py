"""Heartbeats of a process's long-running loops, and which of them stopped beating. Pure: the
clock is given, nothing here sleeps or reads the network.

Every loop that runs for the life of a process (a consumer, a sender's claim loop, the
forwarder, a maintenance job, a LISTEN connection's keeper, the readiness probe) registers with
a bound and beats at least once per bound: at each turn, before and after any wait. A loop
that has not beaten within its bound is stuck (a lock it waits for forever, a call that never
returns) or gone (its task ended without the process noticing): ``/healthz`` then answers 503
and names it, so a supervisor replaces the process. One registry per process (``HEARTBEATS``).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Stale:
    """A loop that has not beaten within its bound."""

    name: str
    age_s: float
    bound_s: float


@dataclass
class Beat:
    """One loop's handle: ``beat()`` at every turn, ``done()`` when the loop ends on purpose."""

    registry: Heartbeats
    key: int
    name: str

    def __call__(self) -> None:
        self.registry.last[self.key] = self.registry.clock()

    def done(self) -> None:
        self.registry.forget(self.key)


@dataclass
class Heartbeats:
    clock: Callable[[], float] = time.monotonic
    names: dict[int, str] = field(default_factory=dict)
    bounds: dict[int, float] = field(default_factory=dict)
    last: dict[int, float] = field(default_factory=dict)
    _ids: itertools.count[int] = field(default_factory=itertools.count)

    def loop(self, name: str, bound_s: float) -> Beat:
        """Register a loop that beats at least every ``bound_s``; it has just beaten."""
        if bound_s <= 0:
            raise ValueError("a heartbeat's bound must be positive")
        key = next(self._ids)
        self.names[key], self.bounds[key], self.last[key] = name, bound_s, self.clock()
        return Beat(self, key, name)

    def forget(self, key: int) -> None:
        self.names.pop(key, None)
        self.bounds.pop(key, None)
        self.last.pop(key, None)

    def stale(self) -> list[Stale]:
        """The loops that have not beaten within their bound, the oldest first."""
        now = self.clock()
        out = [
            Stale(self.names[k], now - self.last[k], self.bounds[k])
            for k in self.names
            if now - self.last[k] > self.bounds[k]
        ]
        return sorted(out, key=lambda s: -s.age_s)

    def __len__(self) -> int:
        return len(self.names)


# The process's loops.
HEARTBEATS = Heartbeats()
