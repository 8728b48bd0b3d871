"""The command line as an operator runs it, with input that must be refused and a database that
refuses: one line on stderr, no traceback, never the secret nor the row PostgreSQL quotes in a
CHECK violation's DETAIL (every argument and every command: tests/unit/test_cli_guard.py)."""

from __future__ import annotations

import asyncpg

from tests.support.procs import gateway_cli
from tests.support.send import enqueue

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
URL = "http://127.0.0.1:9/hooks-of-the-bot"
ENV = {"GATEWAY_FORWARD_ALLOW_PRIVATE": "1"}


def one_line_without(err: str, *never: str) -> None:
    assert len(err.splitlines()) == 1, err
    assert "Traceback" not in err and "DETAIL" not in err and "Failing row" not in err
    for text in never:
        assert text not in err, text


async def test_a_destination_name_with_a_trailing_newline_is_refused_without_the_secret(
    db_dsn: str, pool: asyncpg.Pool
) -> None:
    code, out, err = await gateway_cli(
        db_dsn, "destinations", "add", "bot\n", URL, "--events", "message", "--secret", SECRET, env=ENV
    )
    assert code == 2 and out == ""
    one_line_without(err, SECRET, URL)
    assert "argument name: has a control character" in err
    assert await pool.fetchval("SELECT count(*) FROM destinations") == 0
    code, _, err = await gateway_cli(db_dsn, "outbox", "release", "k" * 10_000)
    assert code == 2
    one_line_without(err, "k" * 20)


async def test_a_database_refusal_is_one_line_naming_the_constraint(db_dsn: str, pool: asyncpg.Pool) -> None:
    # Constraints the product does not have, standing in for any the database enforces that a
    # check in Python missed: what PostgreSQL answers carries the whole row in its DETAIL.
    await pool.execute("ALTER TABLE destinations ADD CONSTRAINT not_bot CHECK (name <> 'bot')")
    code, out, err = await gateway_cli(
        db_dsn, "destinations", "add", "bot", URL, "--events", "message", "--secret", SECRET, env=ENV
    )
    assert code == 1 and out == ""
    one_line_without(err, SECRET, URL)
    assert err.startswith("gateway destinations: the database refused it: check violation error")
    assert "destinations, not_bot" in err and "SQLSTATE 23514" in err

    await enqueue(pool, "order-4711", "4915199999999")
    await pool.execute("UPDATE outbox SET state = 'review'")
    await pool.execute("ALTER TABLE outbox ADD CONSTRAINT never_pending CHECK (state <> 'pending')")
    code, out, err = await gateway_cli(db_dsn, "outbox", "release", "order-4711")
    assert code == 1 and out == ""
    one_line_without(err, "4915199999999", "hello order-4711")
    assert "outbox, never_pending" in err
    assert await pool.fetchval("SELECT state FROM outbox") == "review"
