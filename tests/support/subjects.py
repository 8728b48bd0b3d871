"""Dedup keys and their subjects: the table both core.events.subject_of and the SQL
event_subject() (migration 0009) must agree with."""

from __future__ import annotations

SUBJECTS = [
    ("msg:wamid.HBgLNDkxNTE=", "wamid.HBgLNDkxNTE="),
    ("status:wamid.A:delivered:", "wamid.A"),
    ("status:wamid.A:read:4915112345", "wamid.A"),
    ("status:wamid.with:colon:sent:", "wamid.with:colon"),  # everything up to the last two ':'
    ("status:", "status:"),  # not a status key we build: its own subject
    ("status:a:b", "status:a:b"),
    ("evt:evt_123", "evt_123"),
    ("evt:", ""),
    ("acct-error:0a1b2c", "acct-error:0a1b2c"),
    ("change:message_template_status_update:ff00", "change:message_template_status_update:ff00"),
    ("msg:", ""),
    ("message:x", "message:x"),
    ("", ""),
]
