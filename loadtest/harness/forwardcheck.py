"""``run --forward``: Meta -> gateway -> forwarder -> fake receiver, through receiver faults.

The fake receiver runs in its own process (``python -m gateway.testing.fake_receiver``) and is
registered as a destination for every event kind before the run: a Standard Webhooks
destination, or with ``--forward-format meta`` a Meta-format one (each event as its own Meta
webhook body signed X-Hub-Signature-256: the receiver verifies it as a bot built on Meta's
webhooks does, and stands for that bot's handler). With ``--forward-faults`` it
answers 10 % of requests 5xx, answers 2 % only after the forwarder's timeout (having
processed them) and is down for ``--forward-outage-s`` in the middle of the run. Afterwards
every event the consumers processed during the run must have been processed by the receiver
exactly once (it deduplicates copies by ``webhook-id``), and every delivery must be
``delivered``. Reported: receipt -> handler latency, from the gateway's receipt of each event
(``deliveries.received_at``) to the receiver processing it (its first arrival), p50/p99/max.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

from gateway.core import forwarding, stdwebhooks
from gateway.store import deliveries
from gateway.store.db import connect
from gateway.testing.ports import free_port
from loadtest.harness import processes
from loadtest.harness.stats import percentile

DEST = "loadtest"

# The gateway's forwarder, tuned for a run of minutes (production defaults retry for hours).
GATEWAY_ENV = {
    "GATEWAY_RUN_FORWARDER": "true",
    "GATEWAY_FORWARD_TIMEOUT_MS": "1000",
    "GATEWAY_FORWARD_RETRY_BASE_MS": "200",
    "GATEWAY_FORWARD_RETRY_MAX_MS": "5000",
    "GATEWAY_FORWARD_BREAKER_COOLDOWN_S": "2",
    "GATEWAY_FORWARD_POLL_MS": "200",
    "GATEWAY_FORWARD_ALLOW_PRIVATE": "1",  # the fake receiver listens on 127.0.0.1
}


def new_secret(fmt: str) -> str:
    return forwarding.new_secret(fmt)


def start_receiver(
    secret: str, log_dir: Path, max_s: float, *, meta: bool = False, name: str = "receiver"
) -> processes.Proc:
    """The fake receiver in its own process (``meta``: of a Meta-format destination)."""
    port = free_port()
    env = {
        **processes.gateway_env("", 0, processes.DEFAULT_SECRETS, consumers=False),
        "FAKE_RECEIVER_SECRET": secret,
    }
    argv = [
        sys.executable,
        "-m",
        "gateway.testing.fake_receiver",
        "--port",
        str(port),
        "--max-seconds",
        str(max_s),
        *(["--meta"] if meta else []),
    ]
    return processes.Proc(f"fake-{name}", argv, env, log_dir / f"{name}.log", port)


async def register(dsn: str, url: str, secret: str, fmt: str = "standard") -> None:
    conn = await connect(dsn)
    try:
        await deliveries.add_destination(
            conn, name=DEST, url=url, events=["message", "status", "account"], secret=secret,
            max_in_flight=64, ordered=False, format=fmt,
        )  # fmt: skip
    finally:
        await conn.close()


async def _post(base: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http:
        if body is None:
            async with http.get(base + path, params={"ids": "1"}) as r:
                out: dict[str, Any] = await r.json()
                return out
        async with http.post(base + path, json=body) as r:
            out = await r.json()
            return out


async def faults(base: str, duration_s: float, outage_s: float) -> None:
    """10 % 5xx and 2 % late answers for the whole run; one outage in the middle."""
    await _post(base, "/_fake/config", {"p_5xx": 0.10, "p_timeout": 0.02, "timeout_s": 1.5})
    await asyncio.sleep(max(0.0, duration_s / 2 - outage_s / 2))
    await _post(base, "/_fake/config", {"outage": True})
    await asyncio.sleep(outage_s)
    await _post(base, "/_fake/config", {"outage": False})


async def verify(
    dsn: str, base: str, start_inbox_id: int, timeout_s: float, fmt: str = "standard"
) -> dict[str, Any]:
    """Every key processed in the run reached the receiver once (a Meta-format destination: every
    Meta event's; Tenashi events, evt: keys, have no Meta shape); every delivery delivered."""
    conn = await connect(dsn)
    try:
        keys = {
            r["event_key"]
            for r in await conn.fetch(
                "SELECT event_key FROM processed_webhook_events WHERE inbox_id > $1", start_inbox_id
            )
            if fmt == "standard" or not r["event_key"].startswith("evt:")
        }
        deadline = time.monotonic() + timeout_s
        while True:
            states = {
                r["state"]: r["n"]
                for r in await conn.fetch("SELECT state, count(*) AS n FROM deliveries GROUP BY 1")
            }
            if set(states) <= {"delivered"} or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)
        received = {
            r["webhook_id"]: r["at"]
            for r in await conn.fetch(
                "SELECT webhook_id, extract(epoch FROM received_at)::float8 AS at FROM deliveries"
            )
        }
        delivered_keys = {r["event_key"] for r in await conn.fetch("SELECT event_key FROM deliveries")}
    finally:
        await conn.close()
    rx = await _post(base, "/_fake/state")
    processed = set(rx["ids"])
    # Receipt by the gateway -> processed by the receiver (the bot's handler), per event.
    latency = sorted((rx["ids"][i] - received[i]) * 1000 for i in processed if i in received)
    expected = {stdwebhooks.webhook_id(DEST, k) for k in keys}
    result = {
        "events": len(keys),
        "deliveries": states,
        "receiver_processed": len(processed & expected),
        "lost": len(expected - processed),
        "unexpected": len(processed - expected),
        "without_delivery": len(keys - delivered_keys),
        "attempts": rx["attempts"],
        "copies_deduplicated": rx["duplicates"],
        "bad_signatures": rx["bad_signatures"],
        "answers": rx["answered"],
        "receipt_to_handler_ms": {
            "events": len(latency),
            "p50": percentile(latency, 50),
            "p99": percentile(latency, 99),
            "max": latency[-1] if latency else float("nan"),
        },
    }
    result["ok"] = (
        result["lost"] == 0
        and result["unexpected"] == 0
        and result["without_delivery"] == 0
        and result["bad_signatures"] == 0
        and states == {"delivered": len(keys)}
    )
    return result


def describe(result: dict[str, Any]) -> str:
    lat = result.get("receipt_to_handler_ms") or {}
    return (
        f"receipt -> handler latency over {lat.get('events', 0)} events: p50 {lat.get('p50', 0):.1f} ms, "
        f"p99 {lat.get('p99', 0):.1f} ms, max {lat.get('max', 0):.1f} ms\n"
        f"forwarding: {result['events']} events, receiver processed {result['receiver_processed']} "
        f"(lost {result['lost']}, unexpected {result['unexpected']}, without a delivery "
        f"{result['without_delivery']}); deliveries {result['deliveries']}; {result['attempts']} attempts, "
        f"{result['copies_deduplicated']} copies deduplicated by webhook-id, answers {result['answers']}, "
        f"bad signatures {result['bad_signatures']} -> {'OK' if result['ok'] else 'FAILED'}"
    )
