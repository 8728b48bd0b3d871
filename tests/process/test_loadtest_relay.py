"""bench-pipeline's baseline, the bare relay: it verifies the Meta signature and forwards the
body to both receivers, each verifying its own format's signature, before answering; a badly
signed webhook is refused and reaches neither."""

from __future__ import annotations

from pathlib import Path

import aiohttp

from gateway.core import stdwebhooks
from gateway.core.signature import sign_meta
from loadtest.harness import processes
from loadtest.harness.receiver import Receivers

BODY = b'{"object":"whatsapp_business_account","entry":[]}'


async def test_the_relay_forwards_a_verified_webhook_to_both_receivers(tmp_path: Path) -> None:
    secrets = {"std": stdwebhooks.generate_secret(), "meta": "relay-test-meta-secret"}
    rx = Receivers(tmp_path, 120, {"std": "standard", "meta": "meta"}, secrets)
    relay = None
    try:
        await rx.ready()
        relay = processes.start_baseline(
            "relay", "", processes.DEFAULT_SECRETS, tmp_path, 0,
            ["--std-url", rx.clients["std"].hooks, "--std-secret", secrets["std"],
             "--meta-url", rx.clients["meta"].hooks, "--meta-dest-secret", secrets["meta"]],
        )  # fmt: skip
        await relay.wait_ready()
        url = f"{relay.url}/webhooks/meta"
        async with aiohttp.ClientSession() as http:
            good = {"X-Hub-Signature-256": sign_meta(BODY, processes.DEFAULT_SECRETS.meta)}
            async with http.post(url, data=BODY, headers=good) as r:
                assert r.status == 200
            bad = {"X-Hub-Signature-256": sign_meta(BODY, "not-the-app-secret")}
            async with http.post(url, data=BODY + b" ", headers=bad) as r:
                assert r.status == 401
        for name in ("std", "meta"):
            st = await rx.clients[name].state()
            assert (st["processed"], st["attempts"], st["bad_signatures"]) == (1, 1, 0), (name, st)
    finally:
        if relay is not None:
            relay.stop()
        rx.stop()
