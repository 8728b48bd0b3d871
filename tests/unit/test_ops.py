"""Pure parts of operations: unknown variables, DSN checks, secrets to scrub, access-log sampling."""

from __future__ import annotations

import logging

import pytest

from gateway.core.settings import Settings, SettingsError, unknown_variables
from gateway.runtime.logs import JsonLineFormatter, TextFormatter
from gateway.runtime.startup import where
from gateway.web.access import Sampler, outcome_of, request_id, source_of


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({"GATEWAY_PROT": "1"}, [("GATEWAY_PROT", "GATEWAY_PORT")]),
        ({"GATEWAY_META_APP_SECRET": "x"}, [("GATEWAY_META_APP_SECRET", "GATEWAY_META_APP_SECRETS")]),
        ({"GATEWAY_NOTHING_LIKE_IT": "1"}, [("GATEWAY_NOTHING_LIKE_IT", None)]),
        ({"GATEWAY_PORT": "1", "GATEWAY_FAKE_PORT": "1", "HOME": "/root"}, []),  # known, fake's, not ours
        ({"GATEWAY_WORKER_HEALTH_SOCKET": "/tmp/m/worker-0.sock"}, []),  # what serve --workers sets
    ],
)
def test_unknown_variables(environ: dict[str, str], expected: list[tuple[str, str | None]]) -> None:
    assert unknown_variables(environ) == expected


@pytest.mark.parametrize(
    ("dsn", "ok"),
    [
        ("postgresql://u:p@db:5432/gateway", True),
        ("postgres://u@db/gateway?sslmode=require", True),
        ("postgresql:///gateway?host=/var/run/postgresql", True),
        ("", True),  # empty: the same as unset (the embedded server)
        ("mysql://u:p@db/gateway", False),
        ("db:5432/gateway", False),
        ("postgresql://u:p@db:port/gateway", False),
    ],
)
def test_database_url_is_checked(dsn: str, ok: bool) -> None:
    if ok:
        assert Settings.from_env({"DATABASE_URL": dsn}).database_url == dsn
    else:
        with pytest.raises(SettingsError, match="DATABASE_URL"):
            Settings.from_env({"DATABASE_URL": dsn})


def test_secret_values_include_every_secret_and_the_db_password() -> None:
    s = Settings.from_env(
        {
            "DATABASE_URL": "postgresql://gw:db-pass-word@db/x",
            "GATEWAY_META_APP_SECRETS": "meta-secret-1,meta-secret-2",
            "GATEWAY_API_KEYS": "acme:acme-key-0123456789abcdef",
            "GATEWAY_TENASHI_SECRET": "tenashi-s3cret",
            "GATEWAY_GRAPH_TOKEN": "EAAG-graph-token",
            "GATEWAY_META_VERIFY_TOKEN": "verify-me",
        }
    )
    assert set(s.secret_values()) == {
        "db-pass-word",
        "meta-secret-1",
        "meta-secret-2",
        "acme-key-0123456789abcdef",
        "tenashi-s3cret",
        "EAAG-graph-token",
        "verify-me",
    }
    assert where(s.database_url or "") == "db:5432/x"


@pytest.mark.parametrize("formatter", [TextFormatter("%(message)s"), JsonLineFormatter("%(message)s")])
def test_formatters_scrub_secrets(formatter: TextFormatter | JsonLineFormatter) -> None:
    formatter.secrets = ("db-pass-word",)
    try:
        raise ValueError("could not connect to postgresql://gw:db-pass-word@db/x")
    except ValueError:
        import sys

        record = logging.LogRecord("t", logging.ERROR, "f", 1, "dsn %s", ("gw:db-pass-word",), sys.exc_info())
    line = formatter.format(record)
    assert "db-pass-word" not in line and "***" in line


def test_sampler_keeps_rate_and_counts_what_it_left_out() -> None:
    now = [0.0]
    s = Sampler(rate=2, clock=lambda: now[0])
    taken = [s.take() for _ in range(5)]
    assert taken == [0, 0, None, None, None]
    assert s.take(force=True) == 3  # a 5xx line is always written, and says how many were left out
    now[0] += 0.5  # refills one token
    assert s.take() == 0
    assert s.take() is None


@pytest.mark.parametrize(
    ("path", "status", "source", "outcome"),
    [
        ("/webhooks/meta", 200, "meta", "stored"),
        ("/webhooks/meta", 408, "meta", "slow"),
        ("/webhooks/meta", 415, "meta", "encoded"),
        ("/webhooks/tenashi", 401, "tenashi", "bad_signature"),
        ("/webhooks/meta", 503, "meta", "unavailable"),
        ("/v1/messages", 202, "api", "ok"),
        ("/v1/messages", 422, "api", "rejected"),
        ("/v1/messages", 500, "api", "error"),
        ("/readyz", 200, "ops", "ok"),
    ],
)
def test_source_and_outcome(path: str, status: int, source: str, outcome: str) -> None:
    assert source_of(path) == source
    assert outcome_of(source, status) == outcome


def test_handshake_outcome() -> None:
    assert outcome_of("meta", 200, "GET") == "verified"
    assert outcome_of("meta", 403, "GET") == "refused"


def test_request_id_honoured_only_when_sane() -> None:
    assert request_id("abc-123") == "abc-123"
    for bad in (None, "", "a b", "x" * 129, "line\nbreak"):
        assert len(request_id(bad)) == 16
