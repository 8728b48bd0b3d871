"""Existing bots behind the gateway, unmodified, from PyPI: the pywa example bot
(examples/pywa_bot/bot.py) as its own process, a Meta-format destination, its Graph session
pointed at the gateway; heyoo with its ``url`` set to the gateway. The gateway runs its
consumers, sender and forwarder; the fake Graph API answers the sends and posts the statuses
back, as Meta does."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import heyoo
import pytest
from aiohttp import ClientSession

from gateway.core.settings import Settings
from gateway.core.signature import sign_meta
from gateway.store import deliveries
from gateway.testing.fake_provider import FakeProvider
from gateway.testing.payloads import meta_bytes, meta_payload, meta_value
from tests.support.config import API_KEYS, META_SECRET
from tests.support.procs import free_port
from tests.support.send import send_settings

ROOT = Path(__file__).resolve().parents[2]
BOT = ROOT / "examples" / "pywa_bot" / "bot.py"
APP_SECRET = "0f1e2d3c4b5a69788796a5b4c3d2e1f0"
API_KEY = dict(API_KEYS)["acme"]
PHONE = "4915112345678"
PHONE_BSUID = "US.13491208655302741918"
USERNAME_BSUID = "US.77700011122233344455"


def json_line(raw: bytes) -> dict[str, Any] | None:
    """One line the bot printed, or None when it is not a JSON object (a garbled line)."""
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


class Bot:
    """The pywa bot's process and the JSON lines it printed (one per update it handled)."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.lines: list[dict[str, Any]] = []
        self.garbled: list[bytes] = []  # lines that were not JSON (reported by ``until``)
        self.changed = asyncio.Event()
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        async for raw in self.proc.stdout:
            line = json_line(raw)
            if line is None:
                self.garbled.append(raw)
            else:
                self.lines.append(line)
            self.changed.set()

    def handled(self, kind: str, **match: Any) -> list[dict[str, Any]]:
        return [
            x for x in self.lines if x.get("handled") == kind and all(x.get(k) == v for k, v in match.items())
        ]

    async def until(
        self, kind: str, n: int = 1, timeout_s: float = 30.0, **match: Any
    ) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout_s
        while len(found := self.handled(kind, **match)) < n:
            left = deadline - time.monotonic()
            assert left > 0, f"the bot handled {found} of {n} {kind} {match}; it printed {self.lines}" + (
                f" and lines that were not JSON: {self.garbled}" if self.garbled else ""
            )
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), min(left, 0.5))
        return found


@contextlib.asynccontextmanager
async def pywa_bot(gateway_url: str, port: int) -> AsyncIterator[Bot]:
    env = {
        **os.environ,
        "WA_PHONE_ID": "1111",
        "WA_TOKEN": API_KEY,  # a gateway API key, not a Meta token
        "WA_APP_SECRET": APP_SECRET,
        "WA_VERIFY_TOKEN": "verify-me",
        "GRAPH_URL": gateway_url,  # the gateway, not graph.facebook.com
        "PORT": str(port),
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(BOT), env=env, stdout=asyncio.subprocess.PIPE, cwd=ROOT
    )
    bot = Bot(proc)
    try:
        async with ClientSession() as http:
            for _ in range(300):
                with contextlib.suppress(OSError):
                    query = {"hub.mode": "subscribe", "hub.verify_token": "verify-me", "hub.challenge": "42"}
                    async with http.get(f"http://127.0.0.1:{port}/", params=query) as r:
                        if r.status == 200:
                            break
                assert proc.returncode is None, "the bot exited"
                await asyncio.sleep(0.1)
            else:
                raise AssertionError("the pywa bot did not start")
        yield bot
    finally:
        if proc.returncode is None:
            proc.terminate()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), 10)
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        bot.reader.cancel()


def text_message(
    wamid: str, body: str, *, phone: str | None, bsuid: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A text message and its sender's contact, with Meta's 2026 identity fields."""
    msg: dict[str, Any] = {"from_user_id": bsuid, "id": wamid, "timestamp": str(int(time.time())),
                           "type": "text", "text": {"body": body}}  # fmt: skip
    contact: dict[str, Any] = {"profile": {"name": "Ana"}, "user_id": bsuid}
    if phone is not None:
        msg["from"] = phone
        contact["wa_id"] = phone
    else:
        contact["profile"]["username"] = "ana.bot.fan"
    return msg, contact


async def post_to_gateway(http: ClientSession, url: str, payload: dict[str, Any]) -> None:
    body = meta_bytes(payload)
    headers = {"X-Hub-Signature-256": sign_meta(body, META_SECRET), "Content-Type": "application/json"}
    async with http.post(f"{url}/webhooks/meta", data=body, headers=headers) as r:
        assert r.status == 200


# Many threads printing at once, as pywa's thread pool runs handlers of updates that arrive
# together (a forwarder round delivers a send's statuses at the same moment).
_SAY_FROM_THREADS = """
import importlib.util, sys, threading
spec = importlib.util.spec_from_file_location("bot", sys.argv[1])
bot = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bot)
def run(k):
    for i in range(300):
        bot.say(handled="status", id=f"{k}-{i}", status="delivered", tracker="t" * 50)
threads = [threading.Thread(target=run, args=(k,)) for k in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
"""


def test_the_pywa_bot_prints_whole_lines_from_many_threads() -> None:
    env = {**os.environ, "WA_PHONE_ID": "1111", "WA_TOKEN": "t", "WA_VERIFY_TOKEN": "v", "WA_APP_SECRET": "s"}
    done = subprocess.run(
        [sys.executable, "-c", _SAY_FROM_THREADS, str(BOT)],
        env=env,
        capture_output=True,
        timeout=60,
        check=True,
    )
    raws = done.stdout.splitlines()
    lines = [json_line(raw) for raw in raws]
    garbled = [raw for raw, line in zip(raws, lines, strict=True) if line is None]
    assert not garbled, f"{len(garbled)} of {len(raws)} lines garbled, e.g. {garbled[:2]}"
    ids = [line["id"] for line in lines if line is not None]
    assert sorted(ids) == sorted(f"{k}-{i}" for k in range(8) for i in range(300))


@pytest.fixture
async def running(
    start_gateway: Any, settings: Settings, pool: asyncpg.Pool, fake: FakeProvider
) -> AsyncIterator[tuple[str, Bot]]:
    s = send_settings(
        settings, fake, run_consumers=True, run_sender=True, run_forwarder=True, pair_interval_s=0.0,
        forward_poll_ms=50, send_poll_ms=50, graph_compat_wait_ms=4000,
    )  # fmt: skip
    gw = await start_gateway(s)
    url = str(gw.make_url("")).rstrip("/")
    fake.config.webhook_url = url  # the fake posts its status webhooks to the gateway, as Meta would
    port = free_port()
    await deliveries.add_destination(
        pool, name="pywa", url=f"http://127.0.0.1:{port}/", events=["message", "status"], secret=APP_SECRET,
        max_in_flight=8, ordered=False, format="meta",
    )  # fmt: skip
    async with pywa_bot(url, port) as bot:
        yield url, bot


@pytest.mark.slow
async def test_an_unmodified_pywa_bot_behind_the_gateway(
    running: tuple[str, Bot], fake: FakeProvider, pool: asyncpg.Pool
) -> None:
    url, bot = running
    async with ClientSession() as http:
        # A text Meta delivers three times: the bot's handler fires once.
        msg, contact = text_message("wamid.PYWA1", "hello", phone=PHONE, bsuid=PHONE_BSUID)
        payload = meta_payload(("messages", meta_value(messages=[msg], contacts=[contact])))
        for _ in range(3):
            await post_to_gateway(http, url, payload)
        [handled] = await bot.until("message", id="wamid.PYWA1")
        assert (handled["text"], handled["bsuid"], handled["phone"]) == ("hello", PHONE_BSUID, PHONE)

        # reply_text returned the fake provider's wamid; pywa addressed the BSUID, quoting.
        [sent] = fake.received_by(PHONE_BSUID)
        assert handled["reply"] == sent.id and sent.addressed_by == "recipient"
        assert sent.message["context"] == {"message_id": "wamid.PYWA1"}

        # The reply's statuses reach the bot with the tracker it set.
        try:
            statuses = await bot.until("status", n=3, id=sent.id)
        except AssertionError as exc:  # which of the fake's status webhooks the gateway took
            posted = [(w["body"][-200:], w["status"]) for w in fake.webhooks]
            raise AssertionError(f"{exc}; the fake provider posted {posted}") from exc
        assert {s["status"] for s in statuses} == {"sent", "delivered", "read"}
        assert {s["tracker"] for s in statuses} == {"reply-to:wamid.PYWA1"}

        # A batched webhook with two messages: both handlers fire.
        m2, c2 = text_message("wamid.PYWA2", "two", phone=PHONE, bsuid=PHONE_BSUID)
        m3, _ = text_message("wamid.PYWA3", "three", phone=PHONE, bsuid=PHONE_BSUID)
        batch = meta_payload(("messages", meta_value(messages=[m2, m3], contacts=[c2])))
        await post_to_gateway(http, url, batch)
        await bot.until("message", id="wamid.PYWA2")
        await bot.until("message", id="wamid.PYWA3")

        # A username user (BSUID only, no phone number) gets the reply addressed by BSUID.
        m4, c4 = text_message("wamid.PYWA4", "no phone", phone=None, bsuid=USERNAME_BSUID)
        await post_to_gateway(http, url, meta_payload(("messages", meta_value(messages=[m4], contacts=[c4]))))
        [handled] = await bot.until("message", id="wamid.PYWA4")
        [sent] = fake.received_by(USERNAME_BSUID)
        assert handled["reply"] == sent.id and sent.addressed_by == "recipient" and handled["phone"] is None

    await asyncio.sleep(1.0)  # what a duplicate would have caused has had time to arrive
    assert len(bot.handled("message", id="wamid.PYWA1")) == 1
    assert len(fake.received_by(PHONE_BSUID)) == 3  # one reply per message, no more
    assert await pool.fetchval("SELECT count(*) FROM outbox WHERE state <> 'accepted'") == 0


@pytest.mark.slow
async def test_heyoo_sends_through_the_gateway(
    start_gateway: Any, settings: Settings, pool: asyncpg.Pool, fake: FakeProvider
) -> None:
    s = send_settings(settings, fake, run_sender=True, pair_interval_s=0.0, graph_compat_wait_ms=4000)
    gw = await start_gateway(s)
    messenger = heyoo.WhatsApp(token=API_KEY, phone_number_id="1111")
    messenger.url = str(gw.make_url("/v14.0/1111/messages"))  # the one changed setting besides the token
    # heyoo is synchronous (requests): off the event loop the fake provider runs on.
    answer = await asyncio.to_thread(messenger.send_message, "hello from heyoo", PHONE)
    [sent] = fake.received_by(PHONE)
    assert answer == {"messaging_product": "whatsapp", "contacts": [{"input": PHONE, "wa_id": PHONE}],
                      "messages": [{"id": sent.id}]}  # fmt: skip
    assert sent.message["text"] == {"preview_url": True, "body": "hello from heyoo"}
    # A refusal comes back as Meta's error object, which heyoo returns as it is.
    fake.add_fault("error", to=PHONE, code=131026)
    answer = await asyncio.to_thread(messenger.send_message, "again", PHONE)
    assert answer["error"]["code"] == 131026
    assert await pool.fetchval("SELECT count(*) FROM outbox") == 2
