"""Who a customer is: phone numbers (``wa_id``) and business-scoped user ids. Pure: no I/O.

Since April 2026 Meta names a WhatsApp user by a business-scoped user id (BSUID, ``user_id``,
``CC.<up to 128 alphanumerics>``, e.g. ``US.13491208655302741918``), stable per user and business
portfolio and new when the user changes number, and by a parent BSUID (``CC.ENT.<...>``) where
parent ids are enabled. A phone number (``wa_id``) comes only when Meta may share it: a user with
a username may arrive with none (Meta's "Business-scoped user IDs" guide). A send goes to ``to``
(a phone number) or ``recipient`` (a BSUID or parent BSUID); with both, Meta uses ``to``.

The fields of a webhook that name a customer are read leniently (``ident``): a value in an
unexpected shape is left out of the typed event (it stays in the raw JSON), never a reason to
park the event.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from gateway.core.records import record

BSUID = re.compile(r"[A-Z]{2}\.[A-Za-z0-9]{1,128}")
PARENT_BSUID = re.compile(r"[A-Z]{2}\.ENT\.[A-Za-z0-9]{1,128}")
PHONE = re.compile(r"[0-9]{5,20}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# Longest identifier value kept in a typed field (a BSUID is at most 131 characters).
MAX_IDENT = 256


def ident(value: Any) -> str | None:
    """A customer identifier as sent (a string, or a number Meta meant as one); None for any
    other shape, an empty or over-long value, or one with control characters."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        value = str(value)
    if not isinstance(value, str) or not value or len(value) > MAX_IDENT:
        return None
    if _CONTROL.search(value) is not None:
        return None
    return value


def is_bsuid(value: str) -> bool:
    """A BSUID or a parent BSUID (sent as ``recipient``)."""
    return BSUID.fullmatch(value) is not None or PARENT_BSUID.fullmatch(value) is not None


def is_phone(value: str) -> bool:
    return PHONE.fullmatch(value) is not None


def recipient_field(recipient: str) -> str:
    """The Cloud API field that addresses ``recipient``: ``recipient`` for a (parent) BSUID,
    ``to`` for anything else."""
    return "recipient" if is_bsuid(recipient) else "to"


@record
class Who:
    """A customer as one webhook names them; any part may be missing."""

    wa_id: str | None = None
    user_id: str | None = None
    parent_user_id: str | None = None
    username: str | None = None

    @property
    def address(self) -> str | None:
        """What to send a reply to: the phone number when known, else the BSUID, else the
        parent BSUID."""
        return self.wa_id or self.user_id or self.parent_user_id

    def link(self) -> dict[str, str | None] | None:
        """The phone/BSUID pair this names, for the mapping kept per business number; None when
        there is no well-formed BSUID (nothing to link)."""
        if self.user_id is None or BSUID.fullmatch(self.user_id) is None:
            return None
        wa_id = self.wa_id if self.wa_id is not None and is_phone(self.wa_id) else None
        parent = self.parent_user_id
        if parent is not None and PARENT_BSUID.fullmatch(parent) is None:
            parent = None
        return {"user_id": self.user_id, "wa_id": wa_id, "parent_user_id": parent, "username": self.username}


def _profile(contact: dict[str, Any]) -> dict[str, Any]:
    profile = contact.get("profile")
    return profile if isinstance(profile, dict) else {}


def contact_name(contact: dict[str, Any] | None) -> str | None:
    if contact is None:
        return None
    name = _profile(contact).get("name")
    return name if isinstance(name, str) else None


def from_contact(contact: dict[str, Any] | None) -> Who:
    """The identifiers of one ``contacts[]`` object."""
    if contact is None:
        return Who()
    return Who(
        ident(contact.get("wa_id")),
        ident(contact.get("user_id")),
        ident(contact.get("parent_user_id")),
        ident(_profile(contact).get("username")),
    )


def merge(first: Who, then: Who) -> Who:
    """``first``'s identifiers, completed with ``then``'s."""
    return Who(
        first.wa_id or then.wa_id,
        first.user_id or then.user_id,
        first.parent_user_id or then.parent_user_id,
        first.username or then.username,
    )


# Contacts looked through one by one; a longer list is indexed the first time it is asked.
_SCAN = 8


class Contacts:
    """A change's ``contacts[]``: the contact of each of a change's events is a scan of a short
    list, and a lookup in a long one, indexed once (a change may hold thousands of both)."""

    __slots__ = ("_found", "_index")

    def __init__(self, contacts: Any) -> None:
        self._found = [c for c in contacts if isinstance(c, dict)] if isinstance(contacts, list) else []
        self._index: tuple[dict[str, tuple[int, dict[str, Any]]], ...] | None = None

    def find(self, wa_id: str | None, user_id: str | None) -> dict[str, Any] | None:
        """The first contact naming ``wa_id`` or ``user_id``; the only one when there is exactly
        one and neither names another."""
        found = self._found
        if len(found) > _SCAN:
            return self._lookup(wa_id, user_id)
        for c in found:
            if (wa_id is not None and ident(c.get("wa_id")) == wa_id) or (
                user_id is not None and ident(c.get("user_id")) == user_id
            ):
                return c
        if len(found) == 1:
            only = found[0]
            other_wa, other_user = ident(only.get("wa_id")), ident(only.get("user_id"))
            if (wa_id is None or other_wa is None) and (user_id is None or other_user is None):
                return only
        return None

    def _lookup(self, wa_id: str | None, user_id: str | None) -> dict[str, Any] | None:
        if self._index is None:
            # The first contact naming each identifier, with its place in the list.
            by_wa: dict[str, tuple[int, dict[str, Any]]] = {}
            by_user: dict[str, tuple[int, dict[str, Any]]] = {}
            for i, c in enumerate(self._found):
                wa, user = ident(c.get("wa_id")), ident(c.get("user_id"))
                if wa is not None:
                    by_wa.setdefault(wa, (i, c))
                if user is not None:
                    by_user.setdefault(user, (i, c))
            self._index = (by_wa, by_user)
        by_wa, by_user = self._index
        # ident() never answers "": a missing identifier finds nothing.
        hits = [h for h in (by_wa.get(wa_id or ""), by_user.get(user_id or "")) if h is not None]
        return min(hits, key=lambda h: h[0])[1] if hits else None


def contact_for(contacts: Any, wa_id: str | None, user_id: str | None) -> dict[str, Any] | None:
    """The ``contacts[]`` object of the customer named by ``wa_id`` or ``user_id``; the only
    one when there is exactly one and neither names another."""
    return Contacts(contacts).find(wa_id, user_id)


def links(contacts: Iterable[Any]) -> list[dict[str, str | None]]:
    """The phone/BSUID pairs of every ``contacts[]`` object (any change field carries them)."""
    out = []
    for c in contacts:
        if isinstance(c, dict):
            pair = from_contact(c).link()
            if pair is not None:
                out.append(pair)
    return out
