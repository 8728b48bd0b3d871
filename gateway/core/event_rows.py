"""Events rebuilt from the side-effect tables they were stored in (``inbound_messages``,
``message_statuses``, ...): what backfill forwards again, as the consumer first saw it."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from gateway.core.events import AccountError, AccountUpdate, InboundMessage, Status


def _unix(value: datetime | None) -> int | None:
    return None if value is None else int(value.timestamp())


def message_from_row(row: dict[str, Any], key: str) -> InboundMessage:
    """An ``inbound_messages`` row back into the event the consumer saw."""
    return InboundMessage(
        key=key,
        wamid=row["wamid"],
        phone_number_id=row["phone_number_id"],
        sender=row["sender"],
        type=row["type"],
        timestamp=_unix(row["timestamp"]),
        contact_name=row["contact_name"],
        message=row["message"],
        user_id=row["user_id"],
        parent_user_id=row["parent_user_id"],
        username=row["username"],
        waba_id=row["waba_id"],
        display_phone_number=row["display_phone_number"],
        contact=row["contact"],
    )


def status_from_row(row: dict[str, Any]) -> Status:
    return Status(
        key=row["event_key"],
        wamid=row["wamid"],
        status=row["status"],
        participant=row["participant"],
        recipient=row["recipient"],
        timestamp=_unix(row["timestamp"]),
        callback_data=row["callback_data"],
        errors=row["errors"],
        raw=row["raw"],
        recipient_user_id=row["recipient_user_id"],
        recipient_parent_user_id=row["recipient_parent_user_id"],
        recipient_username=row["recipient_username"],
        phone_number_id=row["phone_number_id"],
        waba_id=row["waba_id"],
        display_phone_number=row["display_phone_number"],
        contact=row["contact"],
        biz_opaque_callback_data=row["biz_opaque_callback_data"],
    )


def account_error_from_row(row: dict[str, Any]) -> AccountError:
    return AccountError(
        key=row["event_key"],
        waba_id=row["waba_id"],
        phone_number_id=row["phone_number_id"],
        field=row["field"],
        errors=row["errors"],
        raw=row["raw"],
    )


def account_update_from_row(row: dict[str, Any]) -> AccountUpdate:
    return AccountUpdate(key=row["event_key"], waba_id=row["waba_id"], field=row["field"], value=row["value"])
