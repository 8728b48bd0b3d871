"""Every kind of delivery the load harness's payload factory makes, and the secrets it signs
them with (the test gateway's)."""

from __future__ import annotations

from collections.abc import Callable

from loadtest.harness.payloads import Delivery, PayloadFactory, Secrets
from tests.support.config import META_SECRET, TENASHI_SECRET

SECRETS = Secrets(meta=META_SECRET, tenashi=TENASHI_SECRET)

KINDS: dict[str, Callable[[PayloadFactory], Delivery]] = {
    **{
        f"inbound_{t}": (lambda typ: lambda f: f.inbound(typ))(t)
        for t in (
            "text", "image", "document", "audio", "sticker", "location",
            "contacts", "interactive", "button", "reaction",
        )
    },
    "status_sent": lambda f: f.status("sent"),
    "status_delivered": lambda f: f.status("delivered"),
    "status_read": lambda f: f.status("read"),
    "status_failed": lambda f: f.status("failed"),
    "group_status": lambda f: f.group_status(participants=4),
    "batched": lambda f: f.batched(entries=3, changes=2),
    "tenashi_status": lambda f: f.tenashi("message.status"),
    "tenashi_received": lambda f: f.tenashi("message.received"),
    "tenashi_other": lambda f: f.tenashi("number.updated"),
}  # fmt: skip
