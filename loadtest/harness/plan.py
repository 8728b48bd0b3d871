"""The request plan: scenario deliveries on the arrival schedule, with redeliveries and bad signatures.

Pure. A redelivery resends the exact bytes and headers of an earlier delivery, as Meta does:
*immediate* takes the next arrival slot, *delayed* the first slot ``delay_s`` later,
*concurrent* fires at the same instant as the original. Bad signatures are fresh bodies
signed with a wrong secret, so none of their bytes may ever reach the database.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from loadtest.harness.payloads import Delivery, PayloadFactory
from loadtest.harness.scenarios import Scenario


@dataclass(frozen=True, slots=True)
class Mix:
    """Shares (0..1) of arrivals that are redeliveries or badly signed."""

    immediate: float = 0.02
    delayed: float = 0.03
    concurrent: float = 0.02
    bad_signature: float = 0.01
    delay_s: float = 2.0

    def __post_init__(self) -> None:
        shares = (self.immediate, self.delayed, self.concurrent, self.bad_signature)
        if any(not 0 <= x <= 1 for x in shares) or sum(shares) > 0.9:
            raise ValueError("each share must be in [0, 1] and together at most 0.9")
        if self.delay_s < 0:
            raise ValueError("delay_s must be >= 0")


NO_DUPLICATES = Mix(0, 0, 0, 0)


@dataclass(frozen=True, slots=True)
class Shot:
    t: float  # intended start, seconds from the run's start
    delivery: Delivery
    kind: str  # new | immediate | delayed | concurrent | bad_signature


def build(
    offsets: Iterable[float], scen: Scenario, factory: PayloadFactory, mix: Mix, seed: int = 0
) -> Iterator[Shot]:
    """One shot per arrival offset; redeliveries replace new deliveries in later slots."""
    rng = random.Random(seed)
    immediate: deque[Delivery] = deque()
    delayed: deque[tuple[float, Delivery]] = deque()  # due times ascend: FIFO suffices
    concurrent: Delivery | None = None
    last_t = 0.0
    # Normalised so that each kind is the asked share of *all* arrivals, not of new ones.
    new_share = max(1e-9, 1 - mix.immediate - mix.delayed - mix.concurrent - mix.bad_signature)
    p_bad = mix.bad_signature / (mix.bad_signature + new_share)
    p_imm, p_del, p_con = (x / new_share for x in (mix.immediate, mix.delayed, mix.concurrent))
    for t in offsets:
        if concurrent is not None:
            yield Shot(last_t, concurrent, "concurrent")
            concurrent = None
            continue
        if delayed and delayed[0][0] <= t:
            yield Shot(t, delayed.popleft()[1], "delayed")
            continue
        if immediate:
            yield Shot(t, immediate.popleft(), "immediate")
            continue
        last_t = t
        if rng.random() < p_bad:
            yield Shot(t, factory.with_bad_signature(scen.next()), "bad_signature")
            continue
        d = scen.next()
        yield Shot(t, d, "new")
        u = rng.random()
        if u < p_imm:
            immediate.append(d)
        elif u < p_imm + p_del:
            delayed.append((t + mix.delay_s, d))
        elif u < p_imm + p_del + p_con:
            concurrent = d
