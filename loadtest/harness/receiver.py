"""The one client of the fake receiver's control endpoints (``gateway.testing.fake_receiver``
in its own process, started by ``processes.start_receiver``): its state, a long-poll until N
events are in, faults and a reset; and a set of receivers, one per destination."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import aiohttp

from loadtest.harness import processes


class Receiver:
    """A fake receiver at ``base`` (``http://127.0.0.1:PORT``); each call its own request."""

    def __init__(self, base: str) -> None:
        self.base = base.rstrip("/")

    @property
    def hooks(self) -> str:
        """The URL a destination posts to."""
        return f"{self.base}/hooks"

    async def _call(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        async with (
            aiohttp.ClientSession() as http,
            http.request(method, f"{self.base}/_fake/{path}", **kw) as r,
        ):
            r.raise_for_status()
            out: dict[str, Any] = await r.json()
            return out

    async def state(self, ids: bool = False) -> dict[str, Any]:
        """Counts; with ``ids`` every processed webhook id and the wall time it arrived."""
        return await self._call("GET", "state", params={"ids": "1"} if ids else {})

    async def wait(self, processed: int, timeout_s: float) -> dict[str, Any]:
        """The state once ``processed`` distinct ids arrived (or at the timeout): one request."""
        return await self._call(
            "GET", "wait", params={"processed": str(processed), "timeout": str(timeout_s)}
        )

    async def reset(self) -> None:
        await self._call("DELETE", "state")

    async def config(self, **cfg: Any) -> dict[str, Any]:
        """Faults (``p_5xx``, ``p_timeout``, ``timeout_s``, ``latency_ms``, ``outage``) and
        ``count_only`` (keep no id: long runs)."""
        return await self._call("POST", "config", json=cfg)


class Receivers:
    """Fake receivers in their own processes, by destination name (``formats``: name ->
    ``standard`` or ``meta``; ``secrets``: name -> its secret): the processes and their clients."""

    def __init__(self, log_dir: Path, max_s: float, formats: dict[str, str], secrets: dict[str, str]) -> None:
        self.secrets = secrets
        self.procs = {
            name: processes.start_receiver(
                secret, log_dir, max_s, meta=formats[name] == "meta", name=f"receiver-{name}"
            )
            for name, secret in secrets.items()
        }
        self.clients = {name: Receiver(p.url) for name, p in self.procs.items()}

    async def ready(self) -> None:
        for p in self.procs.values():
            await p.wait_ready(None)

    async def reset(self, **config: Any) -> None:
        for c in self.clients.values():
            await c.reset()
            if config:
                await c.config(**config)

    async def quiet(self, still_s: float = 1.0, timeout_s: float = 60.0) -> None:
        """Until no request arrives for ``still_s`` (a relay run left queued requests behind)."""
        deadline = time.monotonic() + timeout_s
        seen = -1
        while time.monotonic() < deadline:
            now = sum([(await c.state())["attempts"] for c in self.clients.values()])
            if now == seen:
                return
            seen = now
            await asyncio.sleep(still_s)

    async def missing(self, events: int, timeout_s: float = 60.0) -> dict[str, int]:
        """Per receiver, how many of ``events`` had not arrived within ``timeout_s``."""
        return {n: events - (await c.wait(events, timeout_s))["processed"] for n, c in self.clients.items()}

    def stop(self) -> None:
        for p in self.procs.values():
            p.stop()
