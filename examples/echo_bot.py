"""Echo bot: answers each inbound text message exactly once, through the outbox.

Run it with ``GATEWAY_HANDLERS=examples.echo_bot``. The handler runs inside the consumer's
transaction for the message: the reply's outbox row (and the reply guard) commit together
with the message's key in ``processed_webhook_events``, or not at all. A redelivered
message finds its key and the handler is not called again; even if it were, ``reply``
answers False the second time (the reply claim of (wamid, "echo") and the outbox key
``reply:echo:<wamid>``).
The sender then delivers the reply like any other outbox row.
"""

from __future__ import annotations

from typing import Any

from gateway.core.events import InboundMessage
from gateway.handlers import on, reply

BOT = "echo"
MAX_ECHO = 1000  # Meta allows 4096 characters per text message


@on.message(type="text")
async def echo(event: InboundMessage, conn: Any) -> None:
    text = event.message.get("text")
    body = text.get("body") if isinstance(text, dict) else None
    if not isinstance(body, str) or not body or not event.sender:
        return  # nothing to echo, or no one to answer
    await reply(conn, event, bot=BOT, text=f"You said: {body[:MAX_ECHO]}")
