"""What the fake provider's Meta and Tenashi parts share: its configuration, the messages a
customer would have received, the fault rules, and the signed webhooks it posts back."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import itertools
import random
import secrets
import time
from dataclasses import dataclass, field
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
    to: str  # the address the send named: a phone number, a BSUID or a parent BSUID
    message: dict[str, Any]
    id: str
    callback_data: str | None
    at: float
    addressed_by: str = "to"  # the request field that named it: "to" or "recipient"
    token: str = ""  # the bearer token the request came with


@dataclass
class Customer:
    """A WhatsApp user as the fake's Graph API knows them (Meta's 2026 identities)."""

    user_id: str  # BSUID
    wa_id: str | None = None
    parent_user_id: str | None = None
    username: str | None = None
    name: str = "Customer"
    share_phone: bool = True  # whether Meta may share the phone number with the business

    def contact(self, *, with_username: bool) -> dict[str, Any]:
        """The customer's ``contacts[]`` object as Meta puts it in a webhook."""
        profile: dict[str, Any] = {"name": self.name}
        if with_username and self.username:
            profile["username"] = self.username
        out: dict[str, Any] = {"profile": profile}
        if self.wa_id and self.share_phone:
            out["wa_id"] = self.wa_id
        out["user_id"] = self.user_id
        if self.parent_user_id:
            out["parent_user_id"] = self.parent_user_id
        return out


@dataclass
class StoredMedia:
    """A media file the fake's Graph API holds (uploaded, or put there by a test)."""

    phone_number_id: str
    mime_type: str
    data: bytes
    # Download behaviour, for tests of slow or lying media hosts.
    chunk_delay_ms: float = 0.0
    declared_size: int | None = None  # Content-Length / file_size to announce (default: the real size)


@dataclass
class ReadReceipt:
    phone_number_id: str
    message_id: str
    typing: bool


def bsuid_for(phone: str) -> str:
    """The BSUID the fake gives a phone number it was not told about (stable per number)."""
    digest = int.from_bytes(hashlib.sha256(phone.encode()).digest()[:8], "big")
    return f"US.{digest:020d}"


@dataclass
class FakeConfig:
    webhook_url: str = ""  # gateway base URL: posts go to /webhooks/meta and /webhooks/tenashi
    app_secret: str = ""
    tenashi_secret: str = ""
    graph_token: str = ""  # empty: any bearer token is accepted
    number_tokens: dict[str, str] = field(default_factory=dict)  # a number's own token (190 otherwise)
    media_url: str = ""  # the download URL media lookups answer (empty: the fake's own)
    tenashi_token: str = ""
    statuses: tuple[str, ...] = ("sent", "delivered", "read")
    duplicates: int = 0  # extra copies of each status webhook
    reorder: bool = False
    # How long a status webhook answered 5xx (or not at all) is retried, backing off to 2 s
    # apart, as Meta does for days; 0: three quick tries.
    retry_s: float = 0.0
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
        self.customers: list[Customer] = []
        self._by_address: dict[str, Customer] = {}
        self.media: dict[str, StoredMedia] = {}
        self.read_receipts: list[ReadReceipt] = []

    def add_media(self, data: bytes, mime_type: str, phone_number_id: str = "1111", **kw: Any) -> str:
        """Store a file as Meta would; its media id."""
        media_id = str(10**15 + next(self._seq))
        self.media[media_id] = StoredMedia(phone_number_id, mime_type, data, **kw)
        return media_id

    def add_customer(self, customer: Customer) -> Customer:
        self.customers.append(customer)
        for address in (customer.wa_id, customer.user_id, customer.parent_user_id):
            if address:
                self._by_address.setdefault(address, customer)
        return customer

    def customer(self, address: str) -> Customer:
        """Whom an address names: a known customer by phone number, BSUID or parent BSUID; else
        a phone number's own customer (with a BSUID of its own), or a BSUID's (no phone)."""
        known = self._by_address.get(address)
        if known is not None:
            return known
        if address.isdigit():
            return self.add_customer(Customer(bsuid_for(address), wa_id=address))
        return self.add_customer(Customer(address))

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
            status, tries = 0, 0
            # Meta retries; a few quick tries are enough for a fake, unless told to keep on.
            until = time.monotonic() + self.config.retry_s
            for attempt in itertools.count():
                if attempt >= 3 and (time.monotonic() >= until or 0 < status < 500):
                    break
                tries += 1
                try:
                    async with self._session.post(
                        self.config.webhook_url + path, data=body, headers=headers
                    ) as resp:
                        status = resp.status
                    if status == 200:
                        break
                except (aiohttp.ClientError, TimeoutError):
                    # The session's total timeout raises TimeoutError, not a ClientError; either
                    # way the next events of this batch must still be posted.
                    status = -1
                await asyncio.sleep(min(0.05 * (attempt + 1) * 2 ** max(0, attempt - 2), 2.0))
            self.webhooks.append({"path": path, "body": body.decode(), "status": status, "attempts": tries})

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
