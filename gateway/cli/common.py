"""What the commands share: argument types and one-line formatting."""

from __future__ import annotations

import argparse
import getpass
from collections.abc import Callable
from datetime import UTC, datetime

from gateway.core.console import parse_when
from gateway.core.settings import Settings
from gateway.operator.actions import Actor

Command = Callable[[Settings, argparse.Namespace], int]


def one_line(text: str | None, width: int = 100) -> str:
    return " ".join((text or "").split())[:width]


def when(raw: str) -> datetime:
    """ISO 8601 (a time without an offset is UTC), or an age: 30m, 2h, 7d."""
    try:
        return parse_when(raw, datetime.now(UTC))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def dead_id(raw: str) -> tuple[str, int]:
    """``R12`` (or ``12``) a whole inbox row, ``E7`` one dead event."""
    kind, digits = (raw[0].upper(), raw[1:]) if raw[:1].isalpha() else ("R", raw)
    if kind not in ("R", "E") or not (digits.isascii() and digits.isdigit()) or len(digits) > 18:
        raise argparse.ArgumentTypeError(f"not a dead id: {raw!r} (R<row id> or E<event id>)")
    return kind, int(digits)


def epoch(raw: str) -> float:
    """An ISO 8601 time (UTC when no offset is given) as epoch seconds."""
    return when(raw).timestamp()


def actor_args(p: argparse.ArgumentParser) -> None:
    """``--actor``: who acts, for the audit log (default: the user running the command)."""
    p.add_argument(
        "--actor",
        type=_actor_name,
        default=None,
        help="who acts, as the audit log records it (default: the current user)",
    )


def _actor_name(raw: str) -> str:
    try:
        return Actor(raw, "cli").name
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def actor(ns: argparse.Namespace) -> Actor:
    name = getattr(ns, "actor", None)
    if not name:
        try:
            name = getpass.getuser()
        except (KeyError, OSError):  # no user name for this uid (a container's)
            name = "unknown"
    return Actor(name, "cli")
