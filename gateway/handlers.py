"""Handlers: your code inside the consumer's transaction, exactly once per event.

Write a module, name it in ``GATEWAY_HANDLERS`` (``package.module``, comma-separated), and
register functions with the decorators of ``on``::

    from gateway.handlers import on, reply

    @on.message(type="text")
    async def echo(event, conn):
        await reply(conn, event, bot="echo", text=event.message["text"]["body"])

    @on.status("failed", numbers=["1111"])  # only messages sent from number 1111
    async def failed(event, conn):
        await conn.execute("UPDATE orders SET state = 'failed' WHERE wamid = $1", event.wamid)

A handler gets the typed event (``gateway.core.events``: ``InboundMessage``, ``Status``,
``AccountError``, ``AccountUpdate``) and the connection of the transaction that records
the event's key in ``processed_webhook_events``. What it writes through that connection
commits together with the key, or not at all; a redelivered event finds its key and no
handler runs again. A handler that raises or runs longer than ``GATEWAY_HANDLER_TIMEOUT_MS``
fails only its own event: the rest of the batch commits, the event is retried with backoff
and finally parked dead with the exception's last line (``gateway dead list|show|replay``).
Do not commit, roll back or hold the connection: it is the consumer's. Side effects outside
the database (HTTP calls) are not rolled back and may repeat on a retry.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, TypeVar

from gateway import metrics
from gateway.core.enums import Provider
from gateway.core.events import AccountError, AccountUpdate, Event, InboundMessage, Status
from gateway.store import outbox, replies
from gateway.store.db import Conn

log = logging.getLogger(__name__)

E = TypeVar("E", bound=Event)
# The tenant handler replies are enqueued for (unless a handler names another).
HANDLER_TENANT = "handlers"
Handler = Callable[[Any, Any], Awaitable[None]]
F = TypeVar("F", bound=Handler)


@dataclass(frozen=True, slots=True)
class Registered:
    name: str
    fn: Handler
    match: Callable[[Event], bool]


@dataclass
class Registry:
    """Handlers by the events they want; ``on`` is the one the consumers use."""

    handlers: list[Registered] = field(default_factory=list)

    def _add(self, fn: F, match: Callable[[Event], bool]) -> F:
        name = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
        self.handlers.append(Registered(name, fn, match))
        return fn

    def message(self, *, type: str | None = None, numbers: Iterable[str] | None = None) -> Callable[[F], F]:
        """Inbound messages, optionally of one ``type`` (text, image, interactive, ...) and only to
        some business ``numbers`` (phone_number_ids)."""
        only = None if numbers is None else frozenset(numbers)

        def match(ev: Event) -> bool:
            return (
                isinstance(ev, InboundMessage)
                and (type is None or ev.type == type)
                and (only is None or ev.phone_number_id in only)
            )

        return lambda fn: self._add(fn, match)

    def status(self, *statuses: str, numbers: Iterable[str] | None = None) -> Callable[[F], F]:
        """Status updates, optionally only these (sent, delivered, read, failed, ...) and only of
        messages sent from some business ``numbers``."""
        only = None if numbers is None else frozenset(numbers)

        def match(ev: Event) -> bool:
            return (
                isinstance(ev, Status)
                and (not statuses or ev.status in statuses)
                and (only is None or ev.phone_number_id in only)
            )

        return lambda fn: self._add(fn, match)

    def account_error(self, fn: F) -> F:
        """Account-level errors (a Meta change with ``value.errors``)."""
        return self._add(fn, lambda ev: isinstance(ev, AccountError))

    def account_update(self, fn: F) -> F:
        """Other changes (template status, account updates, other Tenashi events)."""
        return self._add(fn, lambda ev: isinstance(ev, AccountUpdate))

    def for_event(self, ev: Event) -> list[Registered]:
        return [h for h in self.handlers if h.match(ev)]

    def clear(self) -> None:
        self.handlers.clear()

    def __bool__(self) -> bool:
        return bool(self.handlers)


on = Registry()
# Tenants whose bots may each answer one message (GATEWAY_REPLY_PER_BOT_TENANTS), for the
# handlers being run: the consumer running them passes its settings' (``replying``), so reply()
# follows the send API's rule; outside a consumer, one reply per message.
_per_bot_tenants: ContextVar[frozenset[str]] = ContextVar("reply_per_bot_tenants", default=frozenset())


def load(modules: Sequence[str], registry: Registry | None = None) -> Registry:
    """Import each module (its decorators register into ``on``); the registry to use."""
    for name in modules:
        importlib.import_module(name)
    return on if registry is None else registry


@contextmanager
def replying(per_bot_tenants: frozenset[str]) -> Iterator[None]:
    """Run handlers inside this block: their reply() lets each bot of ``per_bot_tenants``
    answer a message (the other tenants: one reply per message)."""
    token = _per_bot_tenants.set(per_bot_tenants)
    try:
        yield
    finally:
        _per_bot_tenants.reset(token)


async def reply(
    conn: Conn,
    event: InboundMessage,
    *,
    text: str,
    bot: str = "echo",
    tenant: str = HANDLER_TENANT,
    provider: Provider | str = Provider.META,
) -> bool:
    """Enqueue a text reply to ``event`` in the handler's transaction; False if the message was
    already answered (logged and counted in ``gateway_replies_refused_total{via="handler"}``).

    The send API's rule, in this transaction: one reply per inbound message whoever answers
    (several, one per bot, for tenants in GATEWAY_REPLY_PER_BOT_TENANTS), claimed in
    ``reply_claims``; and the outbox key ``reply:<bot>:<wamid>`` (unique per tenant). The reply
    threads under the message (Meta's ``context.message_id``) and goes to the sender's phone
    number, or to their BSUID when Meta did not share the number (a user with a username).
    """
    to = event.who.address
    if not to:
        raise ValueError(f"message {event.wamid} has no sender to reply to")
    key = f"reply:{bot}:{event.wamid}"
    first = await replies.claim(
        conn,
        inbound_wamid=event.wamid,
        bot=bot,
        tenant=tenant,
        key=key,
        per_bot=tenant in _per_bot_tenants.get(),
    )
    if first is not None:
        metrics.REPLIES_REFUSED.labels("handler").inc()
        log.warning(
            "reply by %s/%s to %s refused: already answered by %s/%s",
            tenant,
            bot,
            event.wamid,
            first.tenant or "(sql)",
            first.bot,
        )
        return False
    payload: dict[str, Any] = {"type": "text", "text": {"body": text}}
    if str(provider) == Provider.META:
        payload["context"] = {"message_id": event.wamid}
    created, _row = await outbox.enqueue(
        conn,
        outbox.NewMessage(
            tenant=tenant,
            key=key,
            provider=provider,
            phone_number_id=event.phone_number_id or "",
            recipient=to,
            payload=payload,
        ),
    )
    if created:
        await outbox.notify_senders(conn)
    return created
