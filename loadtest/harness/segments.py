"""Where an event's receipt -> downstream time goes, from the timestamps the database keeps:
sent (the generator's intended time) -> stored (its webhook row's INSERT, ``received_at``) ->
keyed (its dedup key's INSERT by a consumer, ``processed_at``) -> queued (its delivery row's
INSERT, ``created_at``) -> received (the fake receiver's clock when it processed it). All
clocks are this machine's."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import asyncpg

from gateway.core import stdwebhooks
from loadtest.harness.sql import q
from loadtest.harness.stats import percentile

SEGMENTS = ("sent -> stored", "stored -> keyed", "keyed -> delivery row", "delivery row -> received")


def split(
    rows: list[Mapping[str, Any]], sent: Mapping[str, float], received: Mapping[str, Mapping[str, float]]
) -> dict[str, dict[str, float]]:
    """Per segment, p50/p90/p99 and the most in ms over every (event, destination) the
    receivers got."""
    spans: dict[str, list[float]] = {s: [] for s in SEGMENTS}
    for r in rows:
        t0 = sent.get(r["event_key"])
        got = received.get(r["name"], {}).get(stdwebhooks.webhook_id(r["name"], r["event_key"]))
        if t0 is None or got is None:
            continue
        marks = (t0, r["stored"], r["keyed"], r["queued"], got)
        for name, a, b in zip(SEGMENTS, marks, marks[1:], strict=False):
            spans[name].append((b - a) * 1000)
    return {
        name: {
            "n": float(len(v)),
            **{f"p{q}_ms": percentile(v, q) for q in (50, 90, 99)},
            "max_ms": max(v, default=0.0),
        }
        for name, v in spans.items()
    }


async def times(dsn: str, keys: list[str]) -> list[Mapping[str, Any]]:
    conn = await asyncpg.connect(dsn)
    try:
        return [dict(r) for r in await conn.fetch(q("pipeline_segments"), keys)]
    finally:
        await conn.close()
