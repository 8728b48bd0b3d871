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
import time
from typing import Any

from gateway.core import destinations, stdwebhooks
from gateway.store import deliveries
from gateway.store.db import connect
from loadtest.harness.receiver import Receiver
from loadtest.harness.sql import queries
from loadtest.harness.stats import percentile

DEST = "loadtest"
SQL = queries("forwarding.sql")

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
    return destinations.new_secret(fmt)


async def register(dsn: str, url: str, secret: str, fmt: str = "standard") -> None:
    conn = await connect(dsn)
    try:
        await deliveries.add_destination(
            conn, name=DEST, url=url, events=["message", "status", "account"], secret=secret,
            max_in_flight=64, ordered=False, format=fmt,
        )  # fmt: skip
    finally:
        await conn.close()


async def faults(rx: Receiver, duration_s: float, outage_s: float) -> None:
    """10 % 5xx and 2 % late answers for the whole run; one outage in the middle."""
    await rx.config(p_5xx=0.10, p_timeout=0.02, timeout_s=1.5)
    await asyncio.sleep(max(0.0, duration_s / 2 - outage_s / 2))
    await rx.config(outage=True)
    await asyncio.sleep(outage_s)
    await rx.config(outage=False)


async def verify(
    dsn: str, rx: Receiver, start_inbox_id: int, timeout_s: float, fmt: str = "standard"
) -> dict[str, Any]:
    """Every key processed in the run reached the receiver once (a Meta-format destination: every
    Meta event's; Tenashi events, evt: keys, have no Meta shape); every delivery delivered."""
    conn = await connect(dsn)
    try:
        keys = {
            r["event_key"]
            for r in await conn.fetch(SQL["fw_keys_processed_since"], start_inbox_id)
            if fmt == "standard" or not r["event_key"].startswith("evt:")
        }
        deadline = time.monotonic() + timeout_s
        while True:
            states = {r["state"]: r["n"] for r in await conn.fetch(SQL["fw_states"])}
            if set(states) <= {"delivered"} or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)
        received = {r["webhook_id"]: r["at"] for r in await conn.fetch(SQL["fw_received_at"])}
        delivered_keys = {r["event_key"] for r in await conn.fetch(SQL["fw_delivery_keys"])}
    finally:
        await conn.close()
    got = await rx.state(ids=True)
    processed = set(got["ids"])
    # Receipt by the gateway -> processed by the receiver (the bot's handler), per event.
    latency = sorted((got["ids"][i] - received[i]) * 1000 for i in processed if i in received)
    expected = {stdwebhooks.webhook_id(DEST, k) for k in keys}
    result = {
        "events": len(keys),
        "deliveries": states,
        "receiver_processed": len(processed & expected),
        "lost": len(expected - processed),
        "unexpected": len(processed - expected),
        "without_delivery": len(keys - delivered_keys),
        "attempts": got["attempts"],
        "copies_deduplicated": got["duplicates"],
        "bad_signatures": got["bad_signatures"],
        "answers": got["answered"],
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
