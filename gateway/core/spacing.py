"""Woken work spaced out: at moderate load a wake-up comes every few ms (each ingest commit
NOTIFYs the consumers, each consumer commit the forwarder), and a loop that runs a step per
wake-up pays a step's fixed cost (a transaction, a multi-CTE statement, a round trip) for one
or two events. Starting woken steps at least ``interval`` apart lets what arrives meanwhile
share one step: fewer, larger batches for the same work, for at most ``interval`` of added
latency. A step that finds a backlog (its batch was full) goes on at once; a wake-up after a
quiet spell waits for nothing.

Pure: the caller passes its clock's time.
"""

from __future__ import annotations


class Spacing:
    """Start times of the steps of one loop, or of loops that share this object."""

    def __init__(self, interval_s: float) -> None:
        self.interval = interval_s
        self._next = float("-inf")  # the earliest start of the next woken step

    def reserve(self, now: float) -> float:
        """A woken step wants to start at ``now``: seconds to wait first. The slot is taken at
        once, so two loops woken together start ``interval`` apart, not together."""
        start = max(now, self._next)
        self._next = start + self.interval
        return start - now

    def started(self, now: float) -> None:
        """A step started without a reservation (a backlog): the next woken one waits for it."""
        self._next = max(self._next, now + self.interval)
