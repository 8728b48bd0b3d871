"""Scripted faults of the fake provider: what a rule looks like and how one is taken.

A rule: ``{"to": "<recipient>" (optional: any), "times": 1, "action": ...}`` where action is
``latency`` (``latency_ms``, then normal), ``hang`` (the message is delivered, the answer never
comes), ``http`` (``status``, e.g. 503, nothing delivered), ``error`` (``code`` from Meta's
error-code reference, in Meta's error shape, nothing delivered), ``drop`` (connection closed,
nothing delivered), ``fail_status`` (accepted, then a ``failed`` status webhook with ``code``),
``split`` (delivered; the answer written in two pieces ``pause_ms`` apart) or ``oversize``
(delivered; the answer padded with a JSON field to ``size`` bytes).
Rules are matched in order; a matching rule is used ``times`` times, then dropped.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from gateway.core.aio import wait_set

ACTIONS = ("latency", "hang", "http", "error", "drop", "fail_status", "split", "oversize")


@dataclass
class Fault:
    action: str
    to: str | None = None
    times: int = 1
    latency_ms: float = 0.0
    status: int = 503
    code: int = 131000
    subcode: int | None = None
    hang_ms: float | None = None  # None: until the fake stops
    pause_ms: float = 50.0
    size: int = 1024 * 1024

    @classmethod
    def parse(cls, raw: Any) -> Fault:
        if not isinstance(raw, dict) or raw.get("action") not in ACTIONS:
            raise ValueError(f"a fault needs action in {ACTIONS}")
        known = {f for f in cls.__dataclass_fields__}
        extra = set(raw) - known
        if extra:
            raise ValueError(f"unknown fault fields: {sorted(extra)}")
        fault = cls(**raw)
        if fault.times < 1:
            raise ValueError("times must be >= 1")
        return fault

    @property
    def failed_code(self) -> int | None:
        """The code of the ``failed`` status this rule asks for (None: not a fail_status rule)."""
        return self.code if self.action == "fail_status" else None


def take(faults: list[Fault], to: str) -> Fault | None:
    """The first rule for ``to`` (or for anyone), used once."""
    for i, fault in enumerate(faults):
        if fault.to is None or fault.to == to:
            fault.times -= 1
            if fault.times <= 0:
                del faults[i]
            return fault
    return None


async def hang(fault: Fault, stopping: asyncio.Event) -> None:
    """Hold the answer back for ``hang_ms``, or until the fake stops."""
    timeout = None if fault.hang_ms is None else fault.hang_ms / 1000
    await wait_set(stopping, timeout)


def drop(request: web.Request) -> web.Response:
    """Close the connection without an answer."""
    if request.transport is not None:
        request.transport.abort()
    return web.Response(status=500)


async def answer(request: web.Request, fault: Fault | None, body: bytes) -> web.StreamResponse:
    """The JSON answer ``body``, as a ``split`` or ``oversize`` rule has it (any other rule, or
    none, leaves it as it is)."""
    if fault is None or fault.action not in ("split", "oversize"):
        return web.Response(body=body, content_type="application/json")
    if fault.action == "oversize":
        pad = max(0, fault.size - len(body) - 12)
        body = body[:-1] + b',"padding":"' + b"x" * pad + b'"}'
    resp = web.StreamResponse(headers={"Content-Type": "application/json"})
    await resp.prepare(request)
    if fault.action == "split":
        await resp.write(body[: len(body) // 2])
        await asyncio.sleep(fault.pause_ms / 1000)
        body = body[len(body) // 2 :]
    await resp.write(body)
    await resp.write_eof()
    return resp
