"""A fake downstream receiver for the forwarder's tests, benchmarks and the load harness.

It verifies every request with the ``standardwebhooks`` package, as a real receiver would (with
``meta=True``: as a bot written against Meta's webhooks does, ``X-Hub-Signature-256`` over the
body with the secret, and the sha256 of each attempt's body is kept), records each attempt's
``webhook-id``, processes an id once (later copies are counted as
duplicates and answered 200) and injects faults: a share of 5xx answers, a share of
"timeouts" (the event is processed, the answer comes too late), added latency, a scripted
answer queue (e.g. 429 with Retry-After) and outages (every request 503 until it ends).

Control endpoints for other processes (loopback only): ``GET /_fake/state`` (``?ids=1``: every
processed id with the wall time it arrived), ``GET /_fake/wait?processed=N&timeout=S`` (the
state once N distinct ids were processed, or at the timeout: one request instead of polling),
``POST /_fake/config`` (any of ``p_5xx``, ``p_timeout``, ``timeout_s``, ``latency_ms``,
``outage``, ``count_only``: keep no id, for long runs), ``DELETE /_fake/state``.

As its own process (benchmarks, the load harness)::

    FAKE_RECEIVER_SECRET=whsec_... python -m gateway.testing.fake_receiver --port 8091
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import os
import random
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from gateway.core.aio import wait_set
from gateway.core.signature import verify_meta


@dataclass
class Scripted:
    status: int
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class ReceiverState:
    attempts: list[str] = field(default_factory=list)  # webhook-id of every attempt, in order
    digests: list[str] = field(default_factory=list)  # meta: sha256 of every attempt's body, in order
    processed: dict[str, Any] = field(default_factory=dict)  # id -> envelope, first time only
    order: list[str] = field(default_factory=list)  # ids in processing order
    arrived: dict[str, float] = field(default_factory=dict)  # id -> wall time first processed
    duplicates: Counter[str] = field(default_factory=Counter)
    bad_signatures: int = 0
    answered: Counter[int] = field(default_factory=Counter)
    in_flight: int = 0
    max_in_flight: int = 0
    attempt_count: int = 0
    counted: int = 0  # processed while count_only (no id kept)


class FakeReceiver:
    def __init__(
        self,
        secret: str,
        *,
        p_5xx: float = 0.0,
        p_timeout: float = 0.0,
        timeout_s: float = 1.0,
        latency_ms: float = 0.0,
        seed: int = 1,
        verify: bool = True,
        meta: bool = False,
    ) -> None:
        self.meta = meta
        self.secret = secret
        self.webhook = None if meta else Webhook(secret)
        self.p_5xx = p_5xx
        self.p_timeout = p_timeout
        self.timeout_s = timeout_s
        self.latency_ms = latency_ms
        self.verify = verify
        self.outage = False
        # A long run: count what arrives, keep no id or body (memory stays flat); copies are
        # not told apart.
        self.count_only = False
        self.script: list[Scripted] = []
        self.rand = random.Random(seed)
        self.state = ReceiverState()
        self.changed = asyncio.Event()
        # (count, future) of a /_fake/wait: resolved by _process when that many ids are in,
        # so waiting costs the receiving path one comparison per event.
        self._awaited: tuple[int, asyncio.Future[None]] | None = None
        self._runner: web.AppRunner | None = None
        self.url = ""

    def app(self) -> web.Application:
        app = web.Application(client_max_size=8 * 1024 * 1024)
        app.router.add_get("/_fake/state", self._get_state)
        app.router.add_get("/_fake/wait", self._wait)
        app.router.add_delete("/_fake/state", self._reset)
        app.router.add_post("/_fake/config", self._config)
        app.router.add_post("/{tail:.*}", self._receive)
        return app

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port, backlog=1024)
        await site.start()
        bound_port = self._runner.addresses[0][1]
        self.url = f"http://{host}:{bound_port}/hooks"
        return self.url

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # --- the receiver -------------------------------------------------------------------------

    async def _receive(self, request: web.Request) -> web.Response:
        st = self.state
        st.in_flight += 1
        st.max_in_flight = max(st.max_in_flight, st.in_flight)
        try:
            return await self._handle(request)
        finally:
            st.in_flight -= 1
            self.changed.set()

    def _answer(self, status: int, headers: dict[str, str] | None = None) -> web.Response:
        self.state.answered[status] += 1
        return web.Response(status=status, headers=headers)

    async def _handle(self, request: web.Request) -> web.Response:
        st = self.state
        body = await request.read()
        msg_id = request.headers.get("webhook-id", "")
        st.attempt_count += 1
        if not self.count_only:
            st.attempts.append(msg_id)
            if self.meta:
                st.digests.append(hashlib.sha256(body).hexdigest())
        if self.verify and not self._verified(body, request):
            st.bad_signatures += 1
            return self._answer(401)
        if self.latency_ms:
            await asyncio.sleep(self.latency_ms / 1000)
        if self.outage:
            return self._answer(503)
        if self.script:
            s = self.script.pop(0)
            return self._answer(s.status, s.headers)
        roll = self.rand.random()
        if roll < self.p_5xx:
            return self._answer(500)
        self._process(msg_id, body)
        if roll < self.p_5xx + self.p_timeout:
            await asyncio.sleep(self.timeout_s)  # processed, but the answer comes too late
        return self._answer(204)

    def _verified(self, body: bytes, request: web.Request) -> bool:
        if self.webhook is None:
            return verify_meta(body, request.headers.get("X-Hub-Signature-256"), (self.secret,))
        try:
            self.webhook.verify(body, dict(request.headers))
        except WebhookVerificationError:
            return False
        return True

    def _process(self, msg_id: str, body: bytes) -> None:
        st = self.state
        if self.count_only:
            st.counted += 1
            return
        if msg_id in st.processed:
            st.duplicates[msg_id] += 1
            return
        env = orjson.loads(body)
        st.processed[msg_id] = env
        st.order.append(msg_id)
        st.arrived[msg_id] = time.time()
        if self._awaited is not None and len(st.processed) >= self._awaited[0]:
            _, fut = self._awaited
            self._awaited = None
            if not fut.done():
                fut.set_result(None)

    # --- control ------------------------------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        st = self.state
        return {
            "attempts": st.attempt_count,
            "processed": len(st.processed) + st.counted,
            "duplicates": sum(st.duplicates.values()),
            "bad_signatures": st.bad_signatures,
            "answered": {str(k): v for k, v in st.answered.items()},
            "max_in_flight": st.max_in_flight,
            "outage": self.outage,
        }

    async def _get_state(self, request: web.Request) -> web.Response:
        out = self.summary()
        if request.query.get("ids"):
            out["ids"] = self.state.arrived  # id -> wall time it was first processed
        return web.json_response(out)

    async def _wait(self, request: web.Request) -> web.Response:
        """Answer once ``processed`` distinct ids are in (or after ``timeout`` seconds)."""
        want = int(request.query["processed"])
        timeout_s = min(float(request.query.get("timeout", "60")), 600.0)
        if len(self.state.processed) < want:
            fut = asyncio.get_running_loop().create_future()
            self._awaited = (want, fut)
            try:
                await asyncio.wait_for(fut, timeout_s)
            except TimeoutError:
                pass
            finally:
                if self._awaited is not None and self._awaited[1] is fut:
                    self._awaited = None
        return web.json_response(self.summary())

    async def _reset(self, request: web.Request) -> web.Response:
        self.state = ReceiverState()
        return web.json_response({"reset": True})

    async def _config(self, request: web.Request) -> web.Response:
        cfg = await request.json()
        for name in ("p_5xx", "p_timeout", "timeout_s", "latency_ms"):
            if name in cfg:
                setattr(self, name, float(cfg[name]))
        if "outage" in cfg:
            self.outage = bool(cfg["outage"])
        if "count_only" in cfg:
            self.count_only = bool(cfg["count_only"])
        return web.json_response(self.summary())

    async def wait_for(self, processed: int, timeout_s: float) -> bool:
        """Until ``processed`` distinct ids arrived, or the timeout; True when they did."""
        deadline = time.monotonic() + timeout_s
        while len(self.state.processed) < processed:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self.changed.clear()
            await wait_set(self.changed, min(left, 0.2))
        return True


async def _serve(secret: str, host: str, port: int, seconds: float, meta: bool = False) -> None:
    receiver = FakeReceiver(secret, timeout_s=30.0, meta=meta)
    url = await receiver.start(host, port)
    print(f"fake receiver listening on {url}", flush=True)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    # Bounded: a receiver left behind by a crashed benchmark still goes away.
    await wait_set(stop, seconds)
    await receiver.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m gateway.testing.fake_receiver", description=__doc__.splitlines()[0]
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8091)
    p.add_argument("--max-seconds", type=float, default=3600.0, help="exit after this long")
    p.add_argument("--meta", action="store_true", help="verify X-Hub-Signature-256 (Meta-format destination)")
    ns = p.parse_args(argv)
    secret = os.environ.get("FAKE_RECEIVER_SECRET", "")
    if not secret:
        print("FAKE_RECEIVER_SECRET (whsec_..., or any string with --meta) is required", file=sys.stderr)
        return 2
    with contextlib.suppress(ImportError):
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    asyncio.run(_serve(secret, ns.host, ns.port, ns.max_seconds, ns.meta))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
