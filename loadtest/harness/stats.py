"""What a run measured: ack latencies (HdrHistogram), outcomes by class, and a per-second timeline."""

from __future__ import annotations

import hashlib
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from hdrh.histogram import HdrHistogram

from loadtest.harness.payloads import Delivery

PERCENTILES = (50.0, 90.0, 99.0, 99.9)
_MAX_US = 3_600_000_000  # one hour, in microseconds


def new_histogram() -> HdrHistogram:
    return HdrHistogram(1, _MAX_US, 3)


def summarise(h: HdrHistogram) -> dict[str, float]:
    """Percentiles and max of a microsecond histogram, in milliseconds."""
    if h.get_total_count() == 0:
        return {"count": 0}
    out: dict[str, float] = {"count": h.get_total_count()}
    for p in PERCENTILES:
        out[f"p{p:g}"] = h.get_value_at_percentile(p) / 1000
    out["max"] = h.get_max_value() / 1000
    out["mean"] = h.get_mean_value() / 1000
    return out


def percentile(values: Sequence[float], p: float) -> float:
    """The ``p``-th percentile of a few thousand samples by the nearest rank (NaN for none);
    a run's acks go through ``summarise`` instead."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def machine() -> str:
    """What the machine was doing, measured now: a shared machine's load shows in the figures."""
    one, five, fifteen = os.getloadavg()
    return f"machine: {os.cpu_count()} CPUs, load average {one:.2f} {five:.2f} {fifteen:.2f}"


def classify(status: int | None, error: str | None, signed_ok: bool) -> str:
    """Outcome class; a 401 for a badly signed request is the right answer, not an error."""
    if error is not None:
        return error
    assert status is not None
    if not signed_ok:
        return "rejected_401" if status == 401 else f"bad_signature_got_{status}"
    return "ok" if status == 200 else f"http_{status}"


@dataclass
class Second:
    """One second of the run, by intended start time."""

    sent: int = 0
    ok: int = 0
    errors: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    completed: int = 0  # responses that arrived in this second (throughput)
    summary: dict[str, float] | None = None

    def close(self) -> None:
        if self.summary is None and self.latencies_ms:
            lat = sorted(self.latencies_ms)
            n = len(lat)
            self.summary = {
                "p50": lat[n // 2],
                "p99": lat[min(n - 1, int(n * 0.99))],
                "max": lat[-1],
            }
            self.latencies_ms = []


class Recorder:
    """Collects every response of one run; latencies are from each request's intended start."""

    def __init__(self) -> None:
        self.hist = new_histogram()
        self.outcomes: Counter[str] = Counter()
        self.kinds: Counter[str] = Counter()
        self.seconds: dict[int, Second] = {}
        self.minutes: dict[int, HdrHistogram] = {}  # to show whether percentiles stay steady
        self.sent = 0
        self.done = 0

    def _second(self, s: int) -> Second:
        sec = self.seconds.get(s)
        if sec is None:
            sec = self.seconds[s] = Second()
        return sec

    def on_send(self, kind: str, intended: float) -> None:
        self.sent += 1
        self.kinds[kind] += 1
        self._second(int(intended)).sent += 1

    def on_done(self, outcome: str, intended: float, finished: float) -> None:
        """``intended`` and ``finished`` are seconds from the run's start."""
        self.done += 1
        self.outcomes[outcome] += 1
        latency = max(0.0, finished - intended)
        sec = self._second(int(intended))
        if outcome in ("ok", "rejected_401"):
            sec.ok += 1
            us = max(1, int(latency * 1_000_000))
            self.hist.record_value(us)
            minute = self.minutes.get(int(intended // 60))
            if minute is None:
                minute = self.minutes[int(intended // 60)] = new_histogram()
            minute.record_value(us)
            sec.latencies_ms.append(latency * 1000)
        else:
            sec.errors += 1
        self._second(int(finished)).completed += 1

    def close_before(self, t: float) -> None:
        for s, sec in self.seconds.items():
            if s < t:
                sec.close()

    def per_minute(self) -> list[dict[str, float]]:
        return [{"minute": m, **summarise(h)} for m, h in sorted(self.minutes.items())]

    def errors(self) -> dict[str, int]:
        return {k: v for k, v in sorted(self.outcomes.items()) if k not in ("ok", "rejected_401")}

    def timeline(self) -> list[dict[str, Any]]:
        self.close_before(float("inf"))
        out = []
        for s in sorted(self.seconds):
            sec = self.seconds[s]
            row: dict[str, Any] = {"t": s, "sent": sec.sent, "ok": sec.ok, "errors": sec.errors}
            row["throughput"] = sec.completed
            if sec.summary:
                row.update({f"{k}_ms": round(v, 3) for k, v in sec.summary.items()})
            out.append(row)
        return out


@dataclass(slots=True)
class Entry:
    keys: tuple[str, ...]
    msg_wamids: tuple[str, ...]
    status_keys: tuple[str, ...]
    sent: int = 0  # sends with a valid signature
    acked: int = 0  # of those, answered 200
    bad_sent: int = 0  # sends with a wrong signature (must never be stored)


class Ledger:
    """Per distinct body (by SHA-256): how often it was sent and acknowledged, and its keys."""

    def __init__(self) -> None:
        self.entries: dict[bytes, Entry] = {}

    def sent(self, d: Delivery) -> bytes:
        digest = hashlib.sha256(d.body).digest()
        e = self.entries.get(digest)
        if e is None:
            e = self.entries[digest] = Entry(d.keys, d.msg_wamids, d.status_keys)
        elif d.keys and not e.keys:
            e.keys, e.msg_wamids, e.status_keys = d.keys, d.msg_wamids, d.status_keys
        if d.signed_ok:
            e.sent += 1
        else:
            e.bad_sent += 1
        return digest

    def acked(self, digest: bytes) -> None:
        self.entries[digest].acked += 1

    def to_json(self) -> bytes:
        """The ledger as JSON (digests in hex), for a verification run in another process."""
        return orjson.dumps(
            {
                d.hex(): [list(e.keys), list(e.msg_wamids), list(e.status_keys), e.sent, e.acked, e.bad_sent]
                for d, e in self.entries.items()
            }
        )

    @classmethod
    def from_json(cls, data: bytes) -> Ledger:
        ledger = cls()
        for digest, (keys, wamids, status_keys, sent, acked, bad) in orjson.loads(data).items():
            ledger.entries[bytes.fromhex(digest)] = Entry(
                tuple(keys), tuple(wamids), tuple(status_keys), sent, acked, bad
            )
        return ledger
