"""Open-model arrival schedules (constant, ramp, steps) and the pacing that follows them. Pure.

Arrivals are fixed in advance as offsets from the start; a request's latency is measured
from its offset (its *intended* start), so a server that stalls cannot hide its queue by
slowing the generator down (coordinated omission).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Segment:
    """Rate moving linearly from ``start_rate`` to ``end_rate`` over ``duration`` seconds."""

    start_rate: float
    end_rate: float
    duration: float

    def count(self) -> float:
        return (self.start_rate + self.end_rate) / 2 * self.duration

    def time_of(self, k: float) -> float:
        """When the cumulative arrival count reaches ``k``: solve r0*t + (r1-r0)*t^2/(2D) = k."""
        r0, r1, d = self.start_rate, self.end_rate, self.duration
        a = (r1 - r0) / (2 * d)
        if abs(a) < 1e-12:
            return k / r0
        disc = r0 * r0 + 4 * a * k
        return (-r0 + math.sqrt(max(disc, 0.0))) / (2 * a)


@dataclass(frozen=True, slots=True)
class Profile:
    segments: tuple[Segment, ...]

    @property
    def duration(self) -> float:
        return sum(s.duration for s in self.segments)

    def expected_count(self) -> int:
        return int(sum(s.count() for s in self.segments))

    def rate_at(self, t: float) -> float:
        for s in self.segments:
            if t < s.duration:
                return s.start_rate + (s.end_rate - s.start_rate) * t / s.duration
            t -= s.duration
        return 0.0


def constant(rate: float, duration: float) -> Profile:
    return Profile((Segment(rate, rate, duration),))


def parse_profile(spec: str) -> Profile:
    """``const:RATE:SECONDS``, ``ramp:FROM:TO:SECONDS``, ``steps:RATE:SECONDS,RATE:SECONDS,...``,
    joined with ``+`` (e.g. ``ramp:0:400:10+const:400:60``)."""
    segments: list[Segment] = []
    for part in spec.split("+"):
        kind, _, rest = part.strip().partition(":")
        try:
            nums = [[float(x) for x in step.split(":")] for step in rest.split(",")]
        except ValueError:
            raise ValueError(f"bad numbers in load profile part {part!r}") from None
        if kind == "const" and len(nums) == 1 and len(nums[0]) == 2:
            segments.append(Segment(nums[0][0], nums[0][0], nums[0][1]))
        elif kind == "ramp" and len(nums) == 1 and len(nums[0]) == 3:
            segments.append(Segment(nums[0][0], nums[0][1], nums[0][2]))
        elif kind == "steps" and all(len(n) == 2 for n in nums):
            segments += [Segment(r, r, d) for r, d in nums]
        else:
            raise ValueError(
                f"bad load profile part {part!r}: use const:RATE:S, ramp:FROM:TO:S or steps:RATE:S,RATE:S"
            )
    for s in segments:
        if s.duration <= 0 or s.start_rate < 0 or s.end_rate < 0 or (s.start_rate == s.end_rate == 0):
            raise ValueError(f"load profile segment needs duration > 0 and a positive rate: {s}")
    return Profile(tuple(segments))


def arrivals(profile: Profile) -> Iterator[float]:
    """Intended start offsets (seconds from t=0), evenly spaced at the instantaneous rate."""
    base = 0.0
    for seg in profile.segments:
        k = 0.5  # centre each arrival in its slot so a segment of N arrivals spans its duration
        n = seg.count()
        while k < n:
            yield base + seg.time_of(k)
            k += 1.0
        base += seg.duration


class Pacer(Generic[T]):
    """Hands out the items that are due (by ``when(item)``); tells the caller how long to sleep."""

    def __init__(self, items: Iterable[T], when: Callable[[T], float]) -> None:
        self._it = iter(items)
        self._when = when
        self._next: T | None = next(self._it, None)

    @property
    def done(self) -> bool:
        return self._next is None

    def due(self, now: float, limit: int = 10_000) -> list[T]:
        """Items whose intended time is <= ``now`` (at most ``limit``), in order."""
        out: list[T] = []
        while self._next is not None and self._when(self._next) <= now and len(out) < limit:
            out.append(self._next)
            self._next = next(self._it, None)
        return out

    def sleep_for(self, now: float) -> float | None:
        return None if self._next is None else max(0.0, self._when(self._next) - now)


class LagMonitor:
    """Tracks how late the generator dispatches against the schedule, per reporting window."""

    def __init__(self, warn_after_s: float = 0.010) -> None:
        self.warn_after_s = warn_after_s
        self.window_max = 0.0
        self.max = 0.0
        self.late = 0  # dispatches later than warn_after_s
        self.total = 0

    def record(self, intended: float, now: float) -> None:
        lag = max(0.0, now - intended)
        self.total += 1
        if lag > self.window_max:
            self.window_max = lag
        if lag > self.max:
            self.max = lag
        if lag > self.warn_after_s:
            self.late += 1

    def take_window(self) -> float:
        w, self.window_max = self.window_max, 0.0
        return w

    def behind(self, window_max: float) -> str | None:
        if window_max > self.warn_after_s:
            return (
                f"generator behind schedule by up to {window_max * 1000:.0f} ms: "
                "its own queueing is in the latencies; lower the rate or free a core"
            )
        return None
