"""Woken work spaced out: at moderate load a wake-up comes every few ms (each ingest commit
NOTIFYs the consumers, each consumer commit the forwarder), and a loop that runs a step per
wake-up pays a step's fixed cost (a transaction, a multi-CTE statement, a round trip) for one
or two events. Starting woken steps a gap apart lets what arrives meanwhile share one step:
fewer, larger batches for the same work, for at most the gap of added latency. A step that
finds a backlog (its batch was full) goes on at once; a wake-up after a quiet spell waits for
nothing.

The gap follows the arrival rate: it is the time the recent rate takes to bring ``gather``
items, at most ``most`` and at least ``least``. At a few hundred events a second that is the
whole ``most`` (where a step's fixed cost dominates, batches grow to about ``gather``); at
higher rates it shrinks (the latency is kept for the time the work itself takes), but not below
``least``: near saturation, steps of a few dozen events cost enough more per event than steps
of a hundred that the loop falls behind the work it keeps up with at a wider gap.
``gather`` 0 keeps the gap at ``most``.

The rate is a count of the items steps reported, decayed exponentially with a time constant of
``window`` seconds (``Rate``): a sum over every loop sharing this object, whatever their steps'
overlap.

The same rate decides how long a lone item waits for company (``linger``): the group committer
holds a webhook that arrives while no batch is being written for a moment, when the rate says
others are likely to come in that moment, so that they share its COMMIT. Only other senders
can bring that company (``Senders``): a client that sends one webhook at a time on one
connection cannot bring another while it waits for its answer.

Pure: the caller passes its clock's time.
"""

from __future__ import annotations

import math


class Rate:
    """Items a second, recently: a count decayed exponentially with a time constant of
    ``window`` seconds."""

    def __init__(self, window_s: float = 1.0) -> None:
        self.window = window_s
        self._count = 0.0  # items counted, decayed to the time ``_at``
        self._at = float("-inf")

    def counted(self, now: float, items: int) -> None:
        self._count = self._decayed(now) + items
        self._at = now

    def at(self, now: float) -> float:
        return self._decayed(now) / self.window

    def _decayed(self, now: float) -> float:
        if self._count == 0.0:
            return 0.0
        return self._count * math.exp(-max(0.0, now - self._at) / self.window)


def linger(rate: float, most: float, gather: float) -> float:
    """Seconds a lone item waits for ``gather`` more at ``rate`` a second, at most ``most``;
    none when ``most`` would likely bring less than half an item (the wait would buy nothing)."""
    if most <= 0 or rate * most < 0.5:
        return 0.0
    return min(most, gather / rate)


class Senders:
    """Whether more than one sender (a connection) sends: an item came from another sender than
    the item before it within the last ``within_s`` seconds."""

    def __init__(self, within_s: float = 1.0) -> None:
        self.within = within_s
        self._last: int | None = None  # the sender of the last item
        self._changed_at = float("-inf")  # when an item last came from another sender

    def seen(self, now: float, sender: int | None) -> None:
        """An item from ``sender`` (None: unknown, counted as another one)."""
        if sender is None or sender != self._last:
            self._last, self._changed_at = sender, now

    def several(self, now: float) -> bool:
        return now - self._changed_at < self.within


class Spacing:
    """Start times of the steps of one loop, or of loops that share this object."""

    def __init__(self, most_s: float, gather: int = 0, window_s: float = 1.0, least_s: float = 0.0) -> None:
        self.most = most_s
        self.least = min(least_s, most_s)
        self.gather = gather
        self._rate = Rate(window_s)
        self._next = float("-inf")  # the earliest start of the next woken step

    def counted(self, now: float, items: int) -> None:
        """A step is done and brought ``items`` (events, deliveries)."""
        self._rate.counted(now, items)

    def gap(self, now: float) -> float:
        """Seconds between the starts of two woken steps from ``now`` on."""
        if self.gather <= 0:
            return self.most
        rate = self._rate.at(now)
        if rate <= 0:
            return self.most
        return min(self.most, max(self.least, self.gather / rate))

    def reserve(self, now: float) -> float:
        """A woken step wants to start at ``now``: seconds to wait first. The slot is taken at
        once, so two loops woken together start a gap apart, not together."""
        start = max(now, self._next)
        self._next = start + self.gap(now)
        return start - now

    def started(self, now: float) -> None:
        """A step started without a reservation (a backlog): the next woken one waits for it."""
        self._next = max(self._next, now + self.gap(now))
