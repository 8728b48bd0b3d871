"""A small HTTP server that records the POSTs it gets and answers each the same way: a stand-in
for a peer whose requests a test wants to read (or deliver later)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from aiohttp import web


@dataclass(frozen=True, slots=True)
class Posted:
    path: str  # with its query string
    headers: dict[str, str]
    body: bytes


@contextlib.asynccontextmanager
async def recorder(
    answer: Callable[[], web.Response], path: str = "/{tail:.*}"
) -> AsyncIterator[tuple[str, list[Posted]]]:
    """A server on 127.0.0.1 for the block: its base URL, and the POSTs to ``path`` so far."""
    seen: list[Posted] = []

    async def keep(request: web.Request) -> web.Response:
        seen.append(Posted(request.path_qs, dict(request.headers), await request.read()))
        return answer()

    app = web.Application()
    app.router.add_post(path, keep)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}", seen
    finally:
        await runner.cleanup()
