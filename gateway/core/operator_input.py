"""What text an operator's command or form may carry: no control character (a newline, a tab, a
NUL, an escape: none means anything in a name, a key, a URL or a secret, and each can forge a
line or cut a string short downstream), no bytes that are not UTF-8, a bounded length."""

from __future__ import annotations

import unicodedata


def text_problem(value: str, max_len: int) -> str | None:
    """Why ``value`` is refused (None: it is not). The reason never quotes the value: it may
    be a secret."""
    if len(value) > max_len:
        return f"longer than {max_len} characters"
    kinds = {unicodedata.category(c) for c in value}
    if "Cc" in kinds:
        return "has a control character (a newline, a tab, a NUL...)"
    if "Cs" in kinds:  # bytes that are not UTF-8, as Python decodes them from a command line
        return "is not valid UTF-8"
    return None
