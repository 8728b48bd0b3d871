"""Staged webhook bodies -> typed events, each with its dedup key. Pure: no I/O.

Keys (fixed names, other parts code against them):

- ``msg:<wamid>`` an inbound Meta message;
- ``status:<wamid>:<status>:<participant>`` a Meta status (participant =
  ``recipient_participant_id``, empty outside groups; a group status listing several
  participants yields one event per participant);
- ``evt:<id>`` a Tenashi event (its body ``id``, else the ``X-Tenashi-Delivery`` header);
- ``acct-error:<sha256>`` a Meta change carrying ``value.errors`` (account-level, no id):
  the hash of the WABA id and the canonical change, so a redelivery has the same key;
- ``change:<field>:<sha256>`` any other change (template status, account updates, ...):
  recorded as an account update for operators, keyed the same way. Nothing is dropped.

Parsing bodies into these events is ``gateway.core.parsing``. A body that is not JSON, or
JSON of a shape we do not know, raises ``PayloadError``: the consumer parks it as dead with
its bytes intact.

Each key has a *subject* (``subject_of``): the value the key is built from (the wamid of a
Meta message or status, the Tenashi event id, else the key itself). It is stored beside the
key and in every side-effect row, in their primary keys: the distribution column the schema
keeps ready for Citus (docs/scaling.md). A pure function of the key, so a redelivery has the
same subject and meets its key; SQL ``event_subject`` (sql/functions/event_subject.sql) is the
same rule.

Each key is stored in the partition of its *event day* (``event_day``): the UTC day of
Meta's own message/status ``timestamp``, which a redelivery repeats, so the redelivery
meets its key in the same partition, whatever the clock did in between. Everything else is
*untimed* and shares one small partition trimmed by age (see docs/scaling.md).
"""

from __future__ import annotations

from dataclasses import field
from datetime import date
from typing import Any, ClassVar

from gateway.core.enums import Source
from gateway.core.identity import Who
from gateway.core.records import record

# Message types whose object names a media file by id (GET /v1/media/{id} downloads it).
MEDIA_TYPES = frozenset({"image", "audio", "video", "document", "sticker"})
MAX_MEDIA_ID = 128

# Meta may batch up to 1000 updates per POST; more than this is not a Meta payload.
MAX_EVENTS_PER_PAYLOAD = 10_000

# The day of keys with no usable event time (the one partition trimmed by DELETE).
UNTIMED_DAY = date(1970, 1, 1)
# A Unix time's UTC day is this ordinal plus its whole days (no time zone lookup per event).
_EPOCH_ORDINAL = UNTIMED_DAY.toordinal()
_DAY_S = 86_400


class PayloadError(ValueError):
    """The body cannot be turned into events; retrying will not help."""


class NotJson(PayloadError):
    pass


class UnknownShape(PayloadError):
    pass


@record
class InboundMessage:
    key: str
    wamid: str
    phone_number_id: str | None
    sender: str | None
    type: str | None
    timestamp: int | None
    contact_name: str | None
    message: dict[str, Any]
    # Who wrote it beside ``sender`` (the phone number, ``from``; absent for a user whose
    # number Meta does not share): the BSUID (``from_user_id`` / ``contacts[].user_id``), the
    # parent BSUID and the username.
    user_id: str | None = None
    parent_user_id: str | None = None
    username: str | None = None
    # Where it came in (the change's ``metadata`` and ``entry[].id``), and the customer's
    # ``contacts[]`` object as Meta sent it.
    waba_id: str | None = None
    display_phone_number: str | None = None
    contact: dict[str, Any] | None = None
    kind: ClassVar[str] = "message"

    @property
    def who(self) -> Who:
        return Who(self.sender, self.user_id, self.parent_user_id, self.username)

    @property
    def media(self) -> tuple[str, str | None] | None:
        """The media id (and MIME type) of an image, audio, video, document or sticker message."""
        obj = self.message.get(self.type) if self.type in MEDIA_TYPES else None
        media_id = obj.get("id") if isinstance(obj, dict) else None
        if not isinstance(media_id, str) or not 0 < len(media_id) <= MAX_MEDIA_ID:
            return None
        mime = obj.get("mime_type") if isinstance(obj, dict) else None
        return media_id, mime if isinstance(mime, str) and len(mime) <= 255 else None

    def to_row(self, inbox_id: int, source: str) -> dict[str, Any]:
        """The ``inbound_messages`` row (as the consumer's batch statement reads it)."""
        return {
            "key": self.key,
            "source": source,
            "wamid": self.wamid,
            "phone_number_id": self.phone_number_id,
            "sender": self.sender,
            "type": self.type,
            "ts": self.timestamp,
            "contact_name": self.contact_name,
            "message": self.message,
            "inbox_id": inbox_id,
            "user_id": self.user_id,
            "parent_user_id": self.parent_user_id,
            "username": self.username,
            "waba_id": self.waba_id,
            "display_phone_number": self.display_phone_number,
            "contact": self.contact,
            "media_id": media[0] if (media := self.media) else None,
            "mime_type": media[1] if media else None,
        }


@record
class Status:
    key: str
    wamid: str
    status: str
    participant: str
    recipient: str | None
    timestamp: int | None
    callback_data: str | None
    errors: list[Any] | None
    raw: dict[str, Any]
    # Whom it was sent to beside ``recipient`` (the phone number, ``recipient_id``): BSUID,
    # parent BSUID, username; where it was sent from; the ``contacts[]`` object (none on
    # ``failed`` statuses).
    recipient_user_id: str | None = None
    recipient_parent_user_id: str | None = None
    recipient_username: str | None = None
    phone_number_id: str | None = None
    waba_id: str | None = None
    display_phone_number: str | None = None
    contact: dict[str, Any] | None = None
    # The send API caller's own biz_opaque_callback_data for the message this status is about
    # (``callback_data`` is the gateway's key, which Meta echoes): filled in when the status is
    # processed, from the outbox row it names.
    biz_opaque_callback_data: str | None = None
    kind: ClassVar[str] = "status"

    @property
    def who(self) -> Who:
        return Who(
            self.recipient, self.recipient_user_id, self.recipient_parent_user_id, self.recipient_username
        )

    def to_row(self, inbox_id: int, source: str) -> dict[str, Any]:
        """The ``message_statuses`` row; it also moves the outbox row it names."""
        return {
            "key": self.key,
            "source": source,
            "wamid": self.wamid,
            "status": self.status,
            "participant": self.participant,
            "recipient": self.recipient,
            "ts": self.timestamp,
            "callback_data": self.callback_data,
            "errors": self.errors,
            "raw": self.raw,
            "inbox_id": inbox_id,
            "recipient_user_id": self.recipient_user_id,
            "recipient_parent_user_id": self.recipient_parent_user_id,
            "recipient_username": self.recipient_username,
            "phone_number_id": self.phone_number_id,
            "waba_id": self.waba_id,
            "display_phone_number": self.display_phone_number,
            "contact": self.contact,
        }


@record
class AccountError:
    key: str
    waba_id: str | None
    phone_number_id: str | None
    field: str
    errors: list[Any]
    raw: dict[str, Any]
    kind: ClassVar[str] = "account_error"

    def to_row(self, inbox_id: int, source: str) -> dict[str, Any]:
        """The ``account_errors`` row."""
        return {
            "key": self.key,
            "waba_id": self.waba_id,
            "phone_number_id": self.phone_number_id,
            "field": self.field,
            "errors": self.errors,
            "raw": self.raw,
            "inbox_id": inbox_id,
        }


@record
class AccountUpdate:
    key: str
    waba_id: str | None
    field: str
    value: Any
    kind: ClassVar[str] = "account_update"

    def to_row(self, inbox_id: int, source: str) -> dict[str, Any]:
        """The ``account_updates`` row."""
        return {
            "key": self.key,
            "waba_id": self.waba_id,
            "field": self.field,
            "value": self.value,
            "inbox_id": inbox_id,
        }


Event = InboundMessage | Status | AccountError | AccountUpdate


@record
class Item:
    """One fragment of a body, processed on its own: a Meta message, a Meta status, a Meta
    change (its account-level part), or a malformed piece of any of them.

    ``path`` locates the fragment in the body (its raw bytes: ``jsonspan.fragment``);
    ``unit`` and ``context`` are what ``parse_fragment`` needs to rebuild the same events
    from those bytes alone. ``error`` is set when the fragment cannot become an event: it is
    parked as a dead item while the rest of the body is processed. ``scrubbed`` says that a
    value PostgreSQL cannot store was escaped (see ``scrub``).
    """

    position: int
    path: tuple[str | int, ...]
    unit: str
    context: dict[str, Any] = field(default_factory=dict)
    events: tuple[Event, ...] = ()
    error: str | None = None
    scrubbed: bool = False


def subject_of(key: str) -> str:
    """The subject of a dedup key (the same rule as SQL ``event_subject``).

    ``msg:<wamid>`` and ``evt:<id>`` give what follows the prefix; ``status:<wamid>:<status>:
    <participant>`` gives the wamid (everything up to the last two ``:``, so a ``:`` inside
    the wamid is kept); any other key (``acct-error:``, ``change:``) is its own subject.
    """
    if key.startswith(("msg:", "evt:")):
        return key[4:]
    if key.startswith("status:"):
        parts = key[7:].rsplit(":", 2)
        if len(parts) == 3:
            return parts[0]
    return key


def event_day(ev: Event, source: str) -> date:
    """The partition day of ``ev``'s dedup key: a pure function of the event, so a redelivery
    computes the same day whatever the clock did in between and meets its key.

    A Meta message or status takes the UTC day of its ``timestamp`` (which a redelivery
    repeats). Events with no timestamp we trust (Tenashi ``evt:`` ids, whose resend behaviour
    is not published; account errors; other changes) are ``UNTIMED_DAY``. A day that has no
    partition (a timestamp far in the past or the future, or a day the maintenance job has not
    made yet) is stored in the table's default partition, trimmed by age; a day's rows there
    move into its partition when it is made (migration 0017).
    """
    if source != Source.META or not isinstance(ev, InboundMessage | Status) or ev.timestamp is None:
        return UNTIMED_DAY
    return date.fromordinal(_EPOCH_ORDINAL + ev.timestamp // _DAY_S)
