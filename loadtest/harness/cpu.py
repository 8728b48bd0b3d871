"""CPU used over a phase, per process group: a server (with its children: ``gateway serve`` is a
parent and its workers), PostgreSQL (backends come and go) and the whole machine (shared: other
work on it shows up as ``machine`` minus the rest). ``steal`` is the time the hypervisor gave
this virtual machine's CPUs to someone else: a phase with much of it ran on a slower machine.

A process that ends within the phase (a PostgreSQL backend whose connection closed, an
autovacuum worker) is counted too: its parent reaps it, and the kernel adds its CPU to the
parent's "children" times, which the parent's group is charged with (less what the process had
used before the phase began)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import psutil


def tree(pid: int) -> list[int]:
    """``pid`` and its descendants now (empty once it is gone)."""
    try:
        root = psutil.Process(pid)
        return [root.pid] + [c.pid for c in root.children(recursive=True)]
    except psutil.Error:
        return []


def postgres_pids(server: Any) -> list[int]:
    """The postmaster and its backends (the benchmark's database load)."""
    if server is None:
        return []
    try:
        return tree(int(server.get_pid()))
    except Exception:
        return []


@dataclasses.dataclass(frozen=True)
class Sample:
    """A process's CPU seconds: its own, and its reaped children's; its parent, its birth."""

    own: float
    reaped: float
    ppid: int
    born: float = 0.0


def _sample(pid: int) -> Sample | None:
    try:
        p = psutil.Process(pid)
        t = p.cpu_times()
        ppid, born = p.ppid(), p.create_time()
    except psutil.Error:
        return None
    return Sample(float(t.user + t.system), float(t.children_user + t.children_system), ppid, born)


def charge(
    groups: dict[str, list[int]], before: dict[int, Sample], after: dict[int, Sample]
) -> dict[str, float]:
    """CPU seconds each group used between two samplings. A process that ended in between shows
    up in its parent's reaped time with all it ever used, so what it had used before is
    taken back from its parent's group; a process born in between started at 0."""
    owner = {pid: k for k, pids in groups.items() for pid in pids}
    out = dict.fromkeys(groups, 0.0)
    # a pid alive at both ends but born in between is another process (the pid was reused)
    ended = {pid: b for pid, b in before.items() if pid not in after or after[pid].born != b.born}
    for pid, s in after.items():
        k = owner.get(pid)
        if k is None:
            continue
        b = None if pid in ended else before.get(pid)
        out[k] += s.own + s.reaped - ((b.own + b.reaped) if b is not None else 0.0)
    for b in ended.values():
        if (k := owner.get(b.ppid)) is not None and b.ppid in after:
            out[k] -= b.own + b.reaped
    return out


class CpuMeter:
    """Cores used over a phase by a server's process tree, by PostgreSQL and by the machine;
    or by the process groups ``groups`` names (asked at the start and at the end)."""

    def __init__(
        self, server_pid: int, pg: Any, groups: Callable[[], dict[str, list[int]]] | None = None
    ) -> None:
        self.server_pid = server_pid
        self.pg = pg
        self.groups = groups
        self.t0 = 0.0
        self.s0: dict[int, Sample] = {}
        self.m0 = psutil.cpu_times()

    def _pids(self) -> dict[str, list[int]]:
        if self.groups is not None:
            return self.groups()
        return {"server": tree(self.server_pid), "postgres": postgres_pids(self.pg)}

    def start(self) -> None:
        self.s0 = self._samples(self._pids())
        self.t0 = time.monotonic()
        self.m0 = psutil.cpu_times()

    def used(self) -> dict[str, float]:
        """CPU seconds each group used since ``start``."""
        groups = self._pids()
        return charge(groups, self.s0, self._samples(groups))

    @staticmethod
    def _samples(groups: dict[str, list[int]]) -> dict[int, Sample]:
        return {pid: s for pids in groups.values() for pid in pids if (s := _sample(pid)) is not None}

    def shares(self) -> dict[str, float]:
        """Cores used on average (1.0 = one core busy all the time)."""
        wall = time.monotonic() - self.t0
        out = {k: round(v / wall, 2) for k, v in self.used().items()}
        m1 = psutil.cpu_times()
        steal = getattr(m1, "steal", 0.0) - getattr(self.m0, "steal", 0.0)  # Linux only
        busy = sum(m1) - m1.idle - (sum(self.m0) - self.m0.idle) - steal
        out["machine"] = round(busy / wall, 2)
        out["steal"] = round(steal / wall, 2)
        return out
