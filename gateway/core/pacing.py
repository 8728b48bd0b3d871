"""Send pacing: one message per ``pair_interval_s`` to a (number, recipient) pair, and a token
bucket per sending number. Pure: the caller passes the time.

State is per process. Several senders pace independently, so with N senders the pair limit
holds per sender; Meta answers 131056 when it is exceeded, which the sender retries after
the pair interval.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class _Bucket:
    tokens: float
    at: float


@dataclass
class Pacer:
    pair_interval_s: float
    number_rate_per_s: float
    # Burst a number may use at once; a second's worth of its rate, at least one message.
    burst: float = 0.0
    # Prune remembered pairs when there are this many (and then at twice the survivors).
    prune_min: int = 10_000
    _last_pair: dict[tuple[str, str], float] = field(default_factory=dict)
    _buckets: dict[str, _Bucket] = field(default_factory=dict)
    _prune_at: int = 0

    def __post_init__(self) -> None:
        self._prune_at = self.prune_min
        if self.burst <= 0:
            self.burst = max(1.0, self.number_rate_per_s)

    def _bucket(self, number: str, now: float) -> _Bucket:
        b = self._buckets.get(number)
        if b is None:
            b = self._buckets[number] = _Bucket(self.burst, now)
        elif now > b.at:
            b.tokens = min(self.burst, b.tokens + (now - b.at) * self.number_rate_per_s)
            b.at = now
        return b

    def try_acquire(self, number: str, recipient: str, now: float) -> float:
        """0.0 and the send is booked; otherwise seconds to wait, and nothing is booked."""
        pair = (number, recipient)
        last = self._last_pair.get(pair)
        pair_wait = 0.0 if last is None else last + self.pair_interval_s - now
        b = self._bucket(number, now)
        number_wait = 0.0 if b.tokens >= 1.0 else (1.0 - b.tokens) / self.number_rate_per_s
        wait = max(pair_wait, number_wait)
        if wait > 0:
            return wait
        b.tokens -= 1.0
        if self.pair_interval_s > 0:
            self._last_pair[pair] = now
            if len(self._last_pair) >= self._prune_at:
                self._prune(now)
        return 0.0

    def _prune(self, now: float) -> None:
        """Forget pairs whose interval has passed, so memory follows the recent recipients only."""
        horizon = now - self.pair_interval_s
        self._last_pair = {p: t for p, t in self._last_pair.items() if t > horizon}
        self._prune_at = max(self.prune_min, 2 * len(self._last_pair))
