"""CPU used over a phase, per process group: a server (with its children: ``gateway serve`` is a
parent and its workers), PostgreSQL (backends come and go) and the whole machine (shared: other
work on it shows up as ``machine`` minus the rest). ``steal`` is the time the hypervisor gave
this virtual machine's CPUs to someone else: a phase with much of it ran on a slower machine."""

from __future__ import annotations

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


def _cpu(pid: int) -> float | None:
    try:
        t = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return None
    return float(t.user + t.system)


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
        self.c0: dict[int, float] = {}
        self.m0 = psutil.cpu_times()

    def _pids(self) -> dict[str, list[int]]:
        if self.groups is not None:
            return self.groups()
        return {"server": tree(self.server_pid), "postgres": postgres_pids(self.pg)}

    def start(self) -> None:
        self.c0 = {pid: c for pids in self._pids().values() for pid in pids if (c := _cpu(pid)) is not None}
        self.t0 = time.monotonic()
        self.m0 = psutil.cpu_times()

    def used(self) -> dict[str, float]:
        """CPU seconds each group used since ``start``."""
        out: dict[str, float] = {}
        for k, pids in self._pids().items():
            used = 0.0
            for pid in pids:
                c = _cpu(pid)
                if c is not None:
                    used += c - self.c0.get(pid, 0.0)  # a process born in the phase started at 0
            out[k] = used
        return out

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
