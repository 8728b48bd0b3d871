"""The one client of the fake receiver's control endpoints (``gateway.testing.fake_receiver``
in its own process, started by ``processes.start_receiver``): its state, a long-poll until N
events are in, faults and a reset."""

from __future__ import annotations

from typing import Any

import aiohttp


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
