from pathlib import Path

import pytest

from gateway.core import tenancy
from gateway.core.settings import Settings, SettingsError, env_names


def test_defaults() -> None:
    s = Settings.from_env({})
    assert (s.host, s.port, s.data_dir) == ("127.0.0.1", 8080, Path("./var"))
    assert s.database_url is None
    assert s.max_body_bytes > 3 * 1024 * 1024
    assert s.dedup_retention_days == 30


def test_parses_lists_and_pairs() -> None:
    s = Settings.from_env(
        {
            "GATEWAY_META_APP_SECRETS": "new-secret-1, old-secret-2",
            "GATEWAY_API_KEYS": "acme:key-aaaaaaaaaaaaaaaa,globex:key:with:colons-bbbb",
            "GATEWAY_TENANT_PROVIDERS": "globex:tenashi",
            "GATEWAY_RUN_SENDER": "no",
            "DATABASE_URL": "postgresql://u:p@db/x",
        }
    )
    assert s.meta_app_secrets == ("new-secret-1", "old-secret-2")
    assert s.api_keys == (("acme", "key-aaaaaaaaaaaaaaaa"), ("globex", "key:with:colons-bbbb"))
    assert tenancy.provider_for(s, "globex") == "tenashi"
    assert tenancy.provider_for(s, "acme") == "meta"
    assert s.run_sender is False


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        ({"GATEWAY_PORT": "http"}, "GATEWAY_PORT: must be an integer"),
        ({"GATEWAY_PORT": "70000"}, "GATEWAY_PORT: must be <= 65535"),
        ({"GATEWAY_MAX_BODY_BYTES": "1048576"}, "GATEWAY_MAX_BODY_BYTES: must be >= 3145728"),
        ({"GATEWAY_COMMIT_WINDOW_MS": "nan"}, "GATEWAY_COMMIT_WINDOW_MS: must be finite"),
        ({"GATEWAY_RUN_CONSUMERS": "maybe"}, "GATEWAY_RUN_CONSUMERS: must be true or false"),
        ({"GATEWAY_META_APP_SECRETS": "short"}, "GATEWAY_META_APP_SECRETS: each secret must be at least 8"),
        ({"GATEWAY_API_KEYS": "acme"}, "GATEWAY_API_KEYS: must be comma-separated name:value pairs"),
        ({"GATEWAY_API_KEYS": "acme:short"}, "GATEWAY_API_KEYS: each API key must be at least 16"),
        ({"GATEWAY_DEDUP_RETENTION_DAYS": "6"}, "GATEWAY_DEDUP_RETENTION_DAYS: must be >= 7"),
        ({"GATEWAY_GRAPH_URL": "ftp://x"}, "GATEWAY_GRAPH_URL: must be an http(s) URL"),
        ({"GATEWAY_TENANT_PROVIDERS": "acme:sms"}, "GATEWAY_TENANT_PROVIDERS: provider for 'acme'"),
        ({"GATEWAY_LOG_LEVEL": "loud"}, "GATEWAY_LOG_LEVEL: must be one of"),
        ({"GATEWAY_DB_POOL_MIN": "20", "GATEWAY_DB_POOL_MAX": "5"}, "GATEWAY_DB_POOL_MIN: must not exceed"),
        ({"DATABASE_URL": "postgresql://u:p@a:5432,b:5432/x"}, "DATABASE_URL: lists several hosts: add"),
        (
            {"DATABASE_URL": "postgresql://u:p@a:5432,b:54x2/x?target_session_attrs=read-write"},
            "DATABASE_URL: has an invalid host or port",
        ),
    ],
)
def test_bad_values_name_the_variable(env: dict[str, str], fragment: str) -> None:
    with pytest.raises(SettingsError) as info:
        Settings.from_env(env)
    assert any(fragment in p for p in info.value.problems), info.value.problems


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://u:p@a:5432,b:5432,c:5432/x?target_session_attrs=read-write",
        "postgres://u@[::1]:5432,10.0.0.2/x?target_session_attrs=primary&sslmode=require",
        "postgresql://u:p@db:5432/x",
    ],
)
def test_database_urls_taken(url: str) -> None:
    assert Settings.from_env({"DATABASE_URL": url}).database_url == url


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(SettingsError) as info:
        Settings.from_env({"GATEWAY_PORT": "x", "GATEWAY_CONSUMER_BATCH": "0"})
    assert len(info.value.problems) == 2


def test_secrets_never_appear_in_errors_or_redacted_view() -> None:
    with pytest.raises(SettingsError) as info:
        Settings.from_env({"GATEWAY_META_APP_SECRETS": "good-secret-value,tiny"})
    assert "tiny" not in str(info.value) and "good-secret-value" not in str(info.value)
    s = Settings.from_env(
        {
            "GATEWAY_META_APP_SECRETS": "good-secret-value",
            "GATEWAY_API_KEYS": "acme:key-aaaaaaaaaaaaaaaa",
            "DATABASE_URL": "postgresql://user:hunter2@db:5432/x",
            "GATEWAY_GRAPH_TOKEN": "EAAG-token",
        }
    )
    text = repr(s.redacted())
    for secret in ("good-secret-value", "key-aaaaaaaaaaaaaaaa", "hunter2", "EAAG-token"):
        assert secret not in text


def test_settings_are_frozen() -> None:
    s = Settings.from_env({})
    with pytest.raises(AttributeError):
        s.port = 1  # type: ignore[misc]


def test_env_names_cover_fixed_interface() -> None:
    names = {n for n, _, _ in env_names()}
    for fixed in (
        "DATABASE_URL",
        "GATEWAY_DATA_DIR",
        "GATEWAY_HOST",
        "GATEWAY_PORT",
        "GATEWAY_META_APP_SECRETS",
        "GATEWAY_META_VERIFY_TOKEN",
        "GATEWAY_GRAPH_URL",
        "GATEWAY_GRAPH_TOKEN",
        "GATEWAY_TENASHI_SECRET",
        "GATEWAY_TENASHI_URL",
        "GATEWAY_TENASHI_TOKEN",
        "GATEWAY_API_KEYS",
    ):
        assert fixed in names


@pytest.mark.parametrize(
    ("dsn", "shown", "secret"),
    [
        ("postgresql://user:hunter2@db:5432/x", "postgresql://user:***@db:5432/x", "hunter2"),
        ("postgresql://user:p@ss@db/x", "postgresql://user:***@db/x", "p@ss"),
        ("postgresql://user@db/x", "postgresql://user@db/x", None),
        ("postgresql://db/x?user=u&password=hunter2", "postgresql://db/x?user=u&password=***", "hunter2"),
        (
            "postgresql://db/x?password=hunter2&sslmode=require",
            "postgresql://db/x?password=***&sslmode=require",
            "hunter2",
        ),
        (
            "postgresql:///x?host=/run/pg&PASSWORD=hunter2",
            "postgresql:///x?host=/run/pg&PASSWORD=***",
            "hunter2",
        ),
        ("postgresql://u:a@db/x?sslpassword=hunter2", "postgresql://u:***@db/x?sslpassword=***", "hunter2"),
        ("postgresql://u@db/x?app=a@b&password=hunter2", None, "hunter2"),
        ("postgresql://user:hunter2/x", "postgresql://user:***/x", "hunter2"),
        ("postgresql://db:5432/x", "postgresql://db:5432/x", None),
        ("postgresql://[::1]/x", "postgresql://[::1]/x", None),
        ("host=db user=u password=hunter2 dbname=x", "host=db user=u password=*** dbname=x", "hunter2"),
        ("host=db password='hun ter2' dbname=x", "host=db password=*** dbname=x", "hun ter2"),
    ],
)
def test_dsn_passwords_are_redacted(dsn: str, shown: str | None, secret: str | None) -> None:
    out = Settings(database_url=dsn).redacted()["database_url"]
    if shown is not None:
        assert out == shown
    if secret is not None:
        assert secret not in out
