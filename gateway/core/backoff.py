"""Retry delays: exponential with full jitter, capped. Pure: the random source is passed in."""

from __future__ import annotations

import random
from collections.abc import Callable


def backoff_delay(
    attempt: int,
    base_s: float,
    cap_s: float,
    rand: Callable[[], float] = random.random,
) -> float:
    """Delay before retry number ``attempt`` (1-based): uniform in [0, min(cap, base * 2**(attempt-1))].

    Full jitter spreads retries of a burst that failed together (AWS architecture blog).
    A floor of half the window keeps retries from bunching at zero.
    """
    if attempt < 1:
        raise ValueError("attempt is 1-based")
    window = min(cap_s, base_s * 2.0 ** min(attempt - 1, 62))
    return window / 2 + rand() * window / 2
