"""An exception as text, one way for each place it is shown: ``describe`` for a row's
``last_error`` and the logs (bounded), ``last_line`` for a handler's failure (a traceback's
last line), ``one_line`` for a start-up message (whitespace folded, short)."""

from __future__ import annotations

# The longest error text kept on a row (last_error) or written to a log line.
MAX_ERROR_CHARS = 2000
# A start-up message names its cause in at most this many characters.
MAX_STARTUP_CHARS = 200


def describe(exc: BaseException) -> str:
    """One bounded line for ``last_error`` and logs."""
    return f"{type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS]


def last_line(exc: BaseException) -> str:
    """The last line of ``exc``'s traceback: ``Type: message``."""
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def one_line(exc: BaseException) -> str:
    """``Type: message`` with the message's whitespace folded to single spaces and cut short
    (``Type`` alone when there is no message): a driver's multi-line error in one line."""
    text = " ".join(str(exc).split())[:MAX_STARTUP_CHARS]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
