"""Connection strings made safe to show, in each of libpq's forms (gateway.core.dsn): the
gateway's settings view and log scrubbing, and the load harness's reports, use the same rules."""

from __future__ import annotations

import pytest

from gateway.core import dsn


@pytest.mark.parametrize(
    ("text", "shown", "passwords"),
    [
        ("postgresql://u:pw-1234@h/db", "postgresql://u:***@h/db", ["pw-1234"]),
        ("postgresql://u:p@ss@h/db", "postgresql://u:***@h/db", ["p@ss"]),
        ("postgresql://postgres:@/gateway?host=/x", "postgresql://postgres:@/gateway?host=/x", []),
        ("postgresql://u@h/db", "postgresql://u@h/db", []),
        ("postgresql:///db?host=/tmp&password=pw-12", "postgresql:///db?host=/tmp&password=***", ["pw-12"]),
        ("postgresql://u:a1@h/x?sslpassword=pw", "postgresql://u:***@h/x?sslpassword=***", ["pw", "a1"]),
        ("postgresql://user:pw-1234/x", "postgresql://user:***/x", ["pw-1234"]),
        ("postgresql://h:5432/db", "postgresql://h:5432/db", []),
        (
            "postgresql://u:pw-9@a:5432,b:5432/x?target_session_attrs=read-write",
            "postgresql://u:***@a:5432,b:5432/x?target_session_attrs=read-write",
            ["pw-9"],
        ),
        ("host=db user=u password=pw-1234 dbname=x", "host=db user=u password=*** dbname=x", ["pw-1234"]),
        ("host=db password='pw 1234' dbname=x", "host=db password=*** dbname=x", ["pw 1234"]),
        ("plain text", "plain text", []),
    ],
)
def test_every_form_of_password_is_hidden_and_named(text: str, shown: str, passwords: list[str]) -> None:
    assert dsn.redact(text) == shown
    assert sorted(dsn.passwords(text)) == sorted(passwords)


@pytest.mark.parametrize(
    ("text", "hosts"),
    [
        ("postgresql://u:p@db:5432/x", ["postgresql://u:p@db:5432/x"]),
        (
            "postgresql://u:p@a:5432,b:5433/x?target_session_attrs=read-write",
            [
                "postgresql://u:p@a:5432/x?target_session_attrs=read-write",
                "postgresql://u:p@b:5433/x?target_session_attrs=read-write",
            ],
        ),
        ("postgres://a,[::1]:6432/x", ["postgres://a/x", "postgres://[::1]:6432/x"]),
        (
            "postgresql://u@h1,h2?sslmode=require",
            ["postgresql://u@h1?sslmode=require", "postgresql://u@h2?sslmode=require"],
        ),
        ("postgresql://u:p@/x?host=/tmp/sock", ["postgresql://u:p@/x?host=/tmp/sock"]),
        ("host=a,b dbname=x", ["host=a,b dbname=x"]),
    ],
)
def test_per_host(text: str, hosts: list[str]) -> None:
    assert dsn.per_host(text) == hosts


@pytest.mark.parametrize(
    ("text", "host"),
    [
        ("postgresql://u:p@a:5432/x?target_session_attrs=read-write", "a:5432"),
        ("postgresql://u:p@/x?host=/tmp/sock", "/tmp/sock"),
        ("postgresql:///x", "localhost"),
        ("host=a dbname=x", "?"),
    ],
)
def test_host_of(text: str, host: str) -> None:
    assert dsn.host_of(text) == host
