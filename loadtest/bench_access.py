"""The access-log middleware's cost per request (request id, access log, send-API metrics).

Runs in-process: one real aiohttp request object per iteration (routed, so the route template
is real), the same trivial handler called bare and through ``gateway.web.access.middleware``;
the figure is the difference per request. Tracing is off (the default). Exits 1 when the
overhead exceeds ``--target-us``.

    python -m loadtest.bench_access [--requests 200000] [--target-us 5]
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from gateway.web import access
from loadtest.harness import contract, report

Call = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def measure(requests: int) -> tuple[float, float]:
    """(bare, with middleware) microseconds per request."""
    response = web.Response(body=b"OK")

    async def handler(request: web.Request) -> web.StreamResponse:
        return response

    app = web.Application()
    app.router.add_post("/webhooks/meta", handler)
    app.freeze()
    pool = []
    for _ in range(1000):
        request = make_mocked_request("POST", "/webhooks/meta", headers={"X-Hub-Signature-256": "x"}, app=app)
        request._match_info = await app.router.resolve(request)
        pool.append(request)
    mw = access.middleware(50.0)

    async def through(request: web.Request) -> web.StreamResponse:
        return await mw(request, handler)

    out = []
    for call in (handler, through):
        started = time.perf_counter()
        for i in range(requests):
            await call(pool[i % 1000])
        out.append((time.perf_counter() - started) / requests * 1e6)
    return out[0], out[1]


HELP = "the access-log middleware's cost per request"


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--requests", type=int, default=200_000)
    p.add_argument("--target-us", type=float, default=5.0, help="most overhead per request")


async def main(ns: argparse.Namespace) -> int:
    run = contract.Run(ns)
    logging.disable(logging.CRITICAL)  # the cost of formatting lines is not the question here
    bare, wrapped = await measure(ns.requests)
    run.target(
        report.Target("access-log middleware overhead per request", wrapped - bare, ns.target_us, "<=", " us")
    )
    text = (
        f"bare handler           {bare:6.2f} us/request\n"
        f"through the middleware {wrapped:6.2f} us/request\n"
        f"overhead               {wrapped - bare:6.2f} us/request"
    )
    return run.finish({"bare_us": bare, "middleware_us": wrapped, "requests": ns.requests}, text)
