"""What every command's input may be, and how a refusal is said: one line on stderr, which never
echoes a value it was given nor a row of the database.

- Every text argument is checked before any command runs: no control character (a newline, a
  NUL, a tab, an escape), valid UTF-8, at most ``MAX_ARG`` characters. The message names the argument, not
  its value (it may be a secret).
- A usage error is one line (argparse's default is the usage, then the error).
- A database error is one line made of what PostgreSQL names (the error's condition, its
  table, column or constraint, its SQLSTATE) and its message's first line, never its DETAIL,
  which may carry values: a CHECK violation's DETAIL is the whole failing row, secrets included.
  A data exception's message (SQLSTATE class 22) is left out too: it can quote the value.
"""

from __future__ import annotations

import argparse
import re
import sys
import unicodedata
from collections.abc import Callable, Iterable
from functools import wraps
from typing import Any, NoReturn

import asyncpg

from gateway.core.operator_input import text_problem

MAX_ARG = 4096
MAX_LINE = 1000
EXIT_REFUSED = 1
EXIT_USAGE = 2

# Errors of the database or of the connection to it that a command may end on.
DATABASE_ERRORS: tuple[type[BaseException], ...] = (
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
    ConnectionError,
    TimeoutError,
)


def checked(convert: Callable[[str], Any] | None) -> Callable[[str], Any]:
    """An argument type that refuses what ``text_problem`` refuses, then converts as before."""

    def as_is(raw: str) -> str:
        return raw

    inner = convert or as_is

    @wraps(inner)
    def check(raw: str) -> Any:
        problem = text_problem(raw, MAX_ARG)
        if problem is not None:
            raise argparse.ArgumentTypeError(problem)
        return inner(raw)

    return check


class Parser(argparse.ArgumentParser):
    """argparse with every text argument checked, and usage errors on one line."""

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        if kwargs.get("action") in (None, "store", "append", "extend"):
            kwargs["type"] = checked(kwargs.get("type"))
        return super().add_argument(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        say(f"{self.prog}: {message} (`{self.prog} --help` shows how)")
        sys.exit(EXIT_USAGE)


def say(line: str, secrets: Iterable[str] = ()) -> None:
    """One line on stderr: control characters shown as spaces, the configured secrets masked,
    cut at ``MAX_LINE`` characters."""
    for secret in sorted(secrets, key=len, reverse=True):
        if secret:
            line = line.replace(secret, "***")
    line = "".join(" " if unicodedata.category(c) == "Cc" else c for c in line)
    if len(line) > MAX_LINE:
        line = line[: MAX_LINE - 1] + "…"
    print(line, file=sys.stderr)


def database_error(exc: BaseException) -> str:
    """What went wrong, from the names PostgreSQL gives and its message's first line (never its
    DETAIL, which quotes rows and values; nor the message of a data exception, SQLSTATE class
    22, which can quote the value it could not take)."""
    if isinstance(exc, asyncpg.PostgresError):
        names = (getattr(exc, n, None) for n in ("table_name", "column_name", "constraint_name"))
        where = ", ".join(n for n in names if n)
        sqlstate = str(exc.sqlstate)
        message = "" if sqlstate.startswith("22") else str(getattr(exc, "message", "") or "")
        return (
            f"the database refused it: {_words(type(exc).__name__)}"
            + (f" ({where})" if where else "")
            + f", SQLSTATE {sqlstate}"
            + (f": {message.splitlines()[0]}" if message.strip() else "")
        )
    return f"the database connection failed ({type(exc).__name__})"


def _words(name: str) -> str:
    """``CheckViolationError`` -> ``check violation error``."""
    return " ".join(w.lower() for w in re.findall(r"[A-Z][a-z0-9]*|[a-z0-9]+", name))
