import logging

from gateway.runtime.logs import Throttled


def record(msg: str, *args: object, exc: BaseException | None = None) -> logging.LogRecord:
    exc_info = (type(exc), exc, None) if exc else None
    return logging.LogRecord("asyncpg.pool", logging.WARNING, "x.py", 1, msg, args, exc_info)


def test_throttled_filter_keeps_one_line_per_interval_without_traceback() -> None:
    f = Throttled(30.0)
    first = record("Failed to restore %s", "the floor", exc=ConnectionRefusedError("refused 100%"))
    assert f.filter(first)
    assert first.exc_info is None
    assert first.getMessage() == "Failed to restore the floor: ConnectionRefusedError: refused 100%"
    assert [f.filter(record("Failed to restore %s", "the floor")) for _ in range(5)] == [False] * 5
    assert f.filter(record("another message"))  # another message has its own budget
