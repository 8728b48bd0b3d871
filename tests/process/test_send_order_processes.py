"""The issue's sequence as an order system sends it, through real processes: five `POST
/v1/messages` on number 1111 (P#1 P#2 Q#1 Q#2 R#1: three customers), two `gateway send`
processes with the default pacing (one message per 6 s per customer), `gateway fake-provider`
over real HTTP. Times come from the fake's record of what reached it.

Bounds are generous (this is not a timing benchmark): a customer's first message arrives within
seconds of the first send, not after another customer's 6 s wait; a customer's messages arrive
in the order they were posted, about the pair interval apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import subprocess
import time
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import ClientSession

from gateway.core.settings import Settings
from tests.support.http import post_message
from tests.support.procs import free_port, spawn

TO = {"P": "4915100000021", "Q": "4915100000022", "R": "4915100000023", "S": "4915100000024"}
PAIR_S = 6.0  # the default GATEWAY_PAIR_INTERVAL_S
# Far below the pair interval, far above a send's own time on a loaded machine.
PROMPT_S = 3.0
# How much earlier one request's arrival may be stamped than the claim that paced it allows.
JITTER_S = 1.0


@contextlib.asynccontextmanager
async def fake_provider(http: ClientSession, log_dir: str) -> AsyncIterator[str]:
    port = free_port()
    proc = spawn(
        ["fake-provider"],
        {"GATEWAY_FAKE_PORT": str(port), "GATEWAY_GRAPH_TOKEN": "t", "GATEWAY_LOG_LEVEL": "warning"},
        f"{log_dir}/fake.log",
    )
    url = f"http://127.0.0.1:{port}"
    try:
        async with asyncio.timeout(30):
            while True:
                assert proc.poll() is None, "the fake provider exited"
                with contextlib.suppress(OSError):
                    async with http.get(f"{url}/_fake/received") as r:
                        if r.status == 200:
                            break
                await asyncio.sleep(0.05)
        yield url
    finally:
        _stop(proc)


def _stop(proc: subprocess.Popen[bytes]) -> int:
    if proc.poll() is None:
        proc.terminate()
    return proc.wait(20)


async def received(http: ClientSession, fake_url: str) -> list[dict[str, Any]]:
    async with http.get(f"{fake_url}/_fake/received") as r:
        got: list[dict[str, Any]] = await r.json()
        return got


async def test_the_issue_sequence_with_two_senders(
    db_dsn: str, http: ClientSession, start_gateway: Any, settings: Settings, tmp_path: object
) -> None:
    gw = await start_gateway(settings)  # the send API; no sender in it

    async def send(body: str) -> None:
        customer = body[0]
        message = {"to": TO[customer], "phone_number_id": "1111", "type": "text", "text": {"body": body}}
        status, _, answer = await post_message(http, gw, message, body)
        assert status == 202, answer

    async with fake_provider(http, str(tmp_path)) as fake_url:
        for body in ("P#1", "P#2", "Q#1", "Q#2", "R#1"):
            await send(body)
        env = {
            "DATABASE_URL": db_dsn,
            "GATEWAY_GRAPH_URL": f"{fake_url}/v21.0",
            "GATEWAY_GRAPH_TOKEN": "t",
            "GATEWAY_LOG_LEVEL": "warning",
        }
        senders = [spawn(["send"], env, f"{tmp_path}/send-{i}.log") for i in range(2)]
        try:
            async with asyncio.timeout(60):
                while not any(m["message"]["text"]["body"] == "P#1" for m in await received(http, fake_url)):
                    await asyncio.sleep(0.05)
            # A later message to Q (a claim after Q#1 and Q#2 were put off) and a new customer.
            posted = time.time()
            await send("Q#3")
            await send("S#1")
            async with asyncio.timeout(60):
                while len(got := await received(http, fake_url)) < 7:
                    await asyncio.sleep(0.1)
            await asyncio.sleep(1.0)  # nothing more arrives
            got = await received(http, fake_url)
        finally:
            codes = [_stop(p) for p in senders]
    assert codes == [0, 0]

    bodies = [m["message"]["text"]["body"] for m in got]
    assert sorted(bodies) == ["P#1", "P#2", "Q#1", "Q#2", "Q#3", "R#1", "S#1"]  # each once
    at = {m["message"]["text"]["body"]: m["at"] for m in got}
    place = {b: i for i, b in enumerate(bodies)}  # the order the fake took them in
    # Nobody waits for another customer's pair interval (before: Q#1 ~5 s, R#1 ~10 s after P#1).
    assert at["Q#1"] - at["P#1"] < PROMPT_S
    assert at["R#1"] - at["P#1"] < PROMPT_S
    assert at["S#1"] - posted < PROMPT_S
    # Each customer's messages in the order posted, the pair interval apart (before: Q#3 could
    # overtake Q#1, whose put-off slot no later claim knew).
    for seq in (["P#1", "P#2"], ["Q#1", "Q#2", "Q#3"]):
        assert [place[b] for b in seq] == sorted(place[b] for b in seq), bodies
        for a, b in itertools.pairwise(seq):
            assert at[b] - at[a] >= PAIR_S - JITTER_S
    # And without waiting much longer than that.
    assert at["P#2"] - at["P#1"] < PAIR_S + PROMPT_S
    assert at["Q#2"] - at["Q#1"] < PAIR_S + PROMPT_S
