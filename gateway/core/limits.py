"""Small counters that bound things: bytes being read at once, log lines per interval. Pure:
the caller passes the time, so tests need no clock and no sleeping."""

from __future__ import annotations


class ByteBudget:
    """Bytes reserved by requests being read; a reservation past ``limit`` is refused.

    The ingest edge reserves a body's declared length before reading it, so a flood of large
    bodies is refused (503) instead of being buffered until memory runs out.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.in_use = 0

    def take(self, n: int) -> bool:
        """Reserve ``n`` bytes; False (and nothing reserved) when that would pass the limit."""
        if n < 0:
            raise ValueError("cannot reserve a negative size")
        if self.in_use + n > self.limit:
            return False
        self.in_use += n
        return True

    def release(self, n: int) -> None:
        self.in_use = max(0, self.in_use - n)


class LogThrottle:
    """At most one line per ``interval_s`` for each key; the next allowed line says how many
    were held back, so an outage logs a few lines a minute, not one per failed batch."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._next: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def allow(self, key: str, now: float) -> int | None:
        """None: hold this line back. Otherwise log it, with the count held back since the last."""
        if now < self._next.get(key, float("-inf")):
            self._held[key] = self._held.get(key, 0) + 1
            return None
        self._next[key] = now + self.interval_s
        return self._held.pop(key, 0)

    @staticmethod
    def suffix(held: int) -> str:
        """Text to append to the allowed line."""
        return f" ({held} more like this held back)" if held else ""
