"""The named states and providers every layer agrees on (the schema's CHECK constraints)."""

from __future__ import annotations

from enum import StrEnum


class Source(StrEnum):
    """Who posted a webhook."""

    META = "meta"
    TENASHI = "tenashi"


class Provider(StrEnum):
    """Who sends an outbox row."""

    META = "meta"
    TENASHI = "tenashi"


class InboxState(StrEnum):
    PENDING = "pending"
    DONE = "done"
    DEAD = "dead"


class OutboxState(StrEnum):
    PENDING = "pending"
    SENDING = "sending"
    ACCEPTED = "accepted"
    UNKNOWN = "unknown"
    FAILED = "failed"
    REVIEW = "review"
    CANCELLED = "cancelled"


class UnknownPolicy(StrEnum):
    """What the reconciler does with a send whose fate stayed unknown."""

    RESEND = "resend"
    REVIEW = "review"
