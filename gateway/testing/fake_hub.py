"""What the fake provider's Meta and Tenashi parts share: its configuration, the messages a
customer would have received, the fault rules, and the signed webhooks it posts back."""

from __future__ import annotations

import asyncio
import base64
import itertools
import random
import secrets
from dataclasses import dataclass
from typing import Any

import aiohttp

from gateway.testing import fake_faults
from gateway.testing.fake_faults import Fault

# A posted webhook: path on the gateway, body bytes (signed as they are), headers.
Webhook = tuple[str, bytes, dict[str, str]]


@dataclass
class Received:
    """One message a customer would have received."""

    provider: str
    phone_number_id: str
    to: str
    message: dict[str, Any]
    id: str
    callback_data: str | None
    at: float


@dataclass
class FakeConfig:
    webhook_url: str = ""  # gateway base URL: posts go to /webhooks/meta and /webhooks/tenashi
    app_secret: str = ""
    tenashi_secret: str = ""
    graph_token: str = ""  # empty: any bearer token is accepted
    tenashi_token: str = ""
    statuses: tuple[str, ...] = ("sent", "delivered", "read")
    duplicates: int = 0  # extra copies of each status webhook
    reorder: bool = False
    webhook_delay_ms: float = 0.0
    seed: int | None = None


class Hub:
    """The shared state; ``FakeProvider`` is one, and its provider parts hold a reference."""

    def __init__(self, config: FakeConfig | None = None) -> None:
        self.config = config or FakeConfig()
        self.received: list[Received] = []
        self.faults: list[Fault] = []
        self.requests = 0
        self.webhooks: list[dict[str, Any]] = []  # what was posted, for tests
        self._seq = itertools.count(1)
        self._rng = random.Random(self.config.seed)
        self._stopping = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._session: aiohttp.ClientSession | None = None

    def take_fault(self, to: str) -> Fault | None:
        return fake_faults.take(self.faults, to)

    async def hang(self, fault: Fault) -> None:
        await fake_faults.hang(fault, self._stopping)

    def next_id(self, to: str) -> str:
        """A wamid-shaped id, unique in this fake."""
        raw = f"{to}:{next(self._seq)}:{secrets.token_hex(6)}".encode()
        return "wamid." + base64.b64encode(b"HBgM" + raw).decode()

    def status_list(self, failed_code: int | None) -> list[str]:
        if failed_code is not None:
            return ["sent", "failed"]
        return list(self.config.statuses)

    def post(self, events: list[Webhook]) -> None:
        """Post ``events`` in the background, with the configured duplicates and reordering."""
        if not self.config.webhook_url or not events:
            return
        out = [e for e in events for _ in range(1 + self.config.duplicates)]
        if self.config.reorder:
            self._rng.shuffle(out)
        self.spawn(self._post_all(out))

    def spawn(self, coro: Any) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _post_all(self, events: list[Webhook]) -> None:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
        for path, body, headers in events:
            if self.config.webhook_delay_ms:
                await asyncio.sleep(self.config.webhook_delay_ms / 1000)
            status = 0
            # Meta retries; a few quick tries are enough for a fake.
            for attempt in range(3):
                try:
                    async with self._session.post(
                        self.config.webhook_url + path, data=body, headers=headers
                    ) as resp:
                        status = resp.status
                    if status == 200:
                        break
                except aiohttp.ClientError:
                    status = -1
                await asyncio.sleep(0.05 * (attempt + 1))
            self.webhooks.append({"path": path, "body": body.decode(), "status": status})

    async def drain_webhooks(self, timeout: float = 10.0) -> None:
        """Wait until every scheduled webhook has been posted."""
        async with asyncio.timeout(timeout):
            while self._tasks:
                await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def close(self) -> None:
        self._stopping.set()
        for task in list(self._tasks):
            task.cancel()
        if self._session is not None:
            await self._session.close()
