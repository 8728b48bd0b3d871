"""The console's pure parts: tokens, login limits, redirects, cursors, bytes, what needs a person."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from gateway.core import console
from gateway.core.settings import Settings, SettingsError

TOKENS = (("alice", "a" * 20, "rw"), ("bob", "b" * 20, "ro"))


@pytest.mark.parametrize(
    ("given", "name", "read_only"),
    [("a" * 20, "alice", False), ("b" * 20, "bob", True), ("a" * 19, None, None), ("", None, None),
     ("a" * 21, None, None), ("A" * 20, None, None)],
)  # fmt: skip
def test_who_a_token_is(given: str, name: str | None, read_only: bool | None) -> None:
    found = console.who(given, TOKENS)
    assert (found.name if found else None, found.read_only if found else None) == (name, read_only)


def test_the_session_key_changes_with_any_token() -> None:
    assert console.session_key(TOKENS) == console.session_key(tuple(reversed(TOKENS)))
    assert console.session_key(TOKENS) != console.session_key((TOKENS[0], ("bob", "c" * 20, "ro")))
    assert console.fingerprint("a" * 20) != console.fingerprint("b" * 20)


def test_failed_logins_are_limited_per_source() -> None:
    limit = console.FailureLimit(per_source=3, per_token=100, window_s=60)
    for i in range(3):
        assert limit.check_source("1.2.3.4", 0) == 0
        limit.begin("1.2.3.4", 0)
        limit.failed(f"wrong-{i}", 0)
    assert limit.check_source("1.2.3.4", 1) == pytest.approx(59)  # whatever token it tries next
    assert limit.check_source("5.6.7.8", 1) == 0  # another source is not held back by it
    assert limit.check_source("1.2.3.4", 61) == 0  # the window passed
    limit.begin("5.6.7.8", 1)
    limit.succeeded("5.6.7.8")  # a success forgets the source's failures
    assert limit.check_source("5.6.7.8", 2) == 0


def test_a_wrong_token_is_limited_from_every_source() -> None:
    limit = console.FailureLimit(per_source=100, per_token=3, window_s=60)
    for i in range(3):
        limit.begin(f"10.0.0.{i}", 0)
        limit.failed("the-same-wrong-token", 0)
    assert limit.check_token("the-same-wrong-token", 1) == pytest.approx(59)
    assert limit.check_token("another-token", 1) == 0
    assert limit.check_source("10.0.0.9", 1) == 0


def test_failures_elsewhere_never_hold_back_a_source_that_has_not_failed() -> None:
    """The issue's flood: 200 failures from 20 sources, each with tokens of its own; a fresh
    source with the right token (never counted, it never failed) goes on."""
    limit = console.FailureLimit()
    for source in range(20):
        for attempt in range(10):
            key = console.token_key(f"guess-{source}-{attempt}")
            assert limit.check_source(f"127.0.0.{source + 2}", 0.0) == 0
            assert limit.check_token(key, 0.0) == 0
            limit.begin(f"127.0.0.{source + 2}", 0.0)
            limit.failed(key, 0.0)
    assert limit.check_source("127.0.0.2", 1.0) > 0
    assert limit.check_source("127.0.0.50", 1.0) == 0
    assert limit.check_token(console.token_key("the-right-token-0123456789"), 1.0) == 0


def test_the_tables_stay_bounded_dropping_the_oldest() -> None:
    limit = console.FailureLimit(per_source=1, per_token=1, window_s=60, tracked=3)
    for i in range(5):
        limit.begin(f"10.0.0.{i}", float(i))
        limit.failed(f"t{i}", float(i))
    assert [limit.check_source(f"10.0.0.{i}", 5) > 0 for i in range(5)] == [False, False, True, True, True]
    assert [limit.check_token(f"t{i}", 5) > 0 for i in range(5)] == [False, False, True, True, True]


@pytest.mark.parametrize(
    ("remote", "source"),
    [
        ("192.0.2.7", "192.0.2.7"),
        ("2001:db8:1:2:aaaa::1", "2001:db8:1:2::/64"),
        ("2001:db8:1:2:ffff:ffff:ffff:ffff", "2001:db8:1:2::/64"),  # the same host's network
        ("2001:db8:1:3::1", "2001:db8:1:3::/64"),
        ("::ffff:192.0.2.7", "192.0.2.7"),
        ("fe80::1%eth0", "fe80::/64"),
        (None, "?"),
        ("not-an-address", "not-an-address"),  # a Unix socket's peer, say
    ],
)
def test_a_source_is_an_ipv4_address_or_an_ipv6_64(remote: str | None, source: str) -> None:
    assert console.source_of(remote) == source


def test_a_token_is_counted_by_a_digest_of_it() -> None:
    assert console.token_key("abc") == console.token_key("abc") != console.token_key("abd")
    assert "abc" not in console.token_key("abc")


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("/outbox?state=review", "/outbox?state=review"),
        ("/", "/"),
        (None, "/"),
        ("", "/"),
        ("https://evil.example/", "/"),
        ("//evil.example/x", "/"),
        ("/\\evil.example", "/"),
        ("javascript:alert(1)", "/"),
        ("/dead\r\nSet-Cookie: x=1", "/"),
        ("dead", "/"),
    ],
)
def test_after_login_only_a_path_of_the_console(raw: str | None, expected: str) -> None:
    assert console.safe_next(raw) == expected


def test_cursors_round_trip_and_malformed_ones_start_over() -> None:
    at = datetime(2026, 11, 30, 8, 15, 2, 123456, tzinfo=UTC)
    assert console.parse_cursor(console.cursor(at, 42)) == (at, 42)
    assert console.parse_cursor(console.cursor(None, 42)) == (None, 42)
    for bad in ("x", "1.x", "9" * 50, "", None, "-5.3.2"):
        assert console.parse_cursor(bad) is None


def test_times_are_iso_or_ages() -> None:
    now = datetime(2026, 12, 1, 12, tzinfo=UTC)
    assert console.parse_when("2h", now) == now - timedelta(hours=2)
    assert console.parse_when("2026-11-30T08:00", now) == datetime(2026, 11, 30, 8, tzinfo=UTC)
    with pytest.raises(ValueError):
        console.parse_when("yesterday", now)


def test_bytes_are_shown_as_text_and_json_when_they_are() -> None:
    assert console.pretty_json(b'{"a":[1,"<b>"]}') == '{\n  "a": [\n    1,\n    "<b>"\n  ]\n}'
    assert console.pretty_json(b"not json") is None
    text, cut = console.shown_text(b"\xff<script>")
    assert (text, cut) == ("\ufffd<script>", False)
    assert console.shown_text(b"x" * (console.SHOWN_BYTES + 1))[1] is True


QUIET = console.Numbers(0, 0.0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3, False)


@pytest.mark.parametrize(
    ("changes", "first"),
    [
        ({}, None),
        ({"outbox_review": 2}, ("warning", "2 send(s) wait for review")),
        ({"dead_events": 1, "partitions_ahead_days": 0}, ("critical", "no day partition ahead")),
        ({"open_sender_breakers": 1, "dead_rows": 3}, ("critical", "1 sender breaker(s) open")),
        ({"maintenance_failing": True}, ("critical", "the maintenance pass is failing")),
        ({"inbox_lag_s": 120.0}, ("critical", "consumers are 120 s behind")),
    ],
)
def test_what_needs_a_person_comes_first(changes: dict[str, object], first: tuple[str, str] | None) -> None:
    got = console.needs(replace(QUIET, **changes))  # type: ignore[arg-type]
    assert (got[0].level, got[0].what[: len(first[1])]) == first if first else got == []


@pytest.mark.parametrize(
    ("env", "problem"),
    [
        ({"GATEWAY_CONSOLE_PORT": "8081"}, "GATEWAY_CONSOLE_TOKENS: must be set"),
        ({"GATEWAY_CONSOLE_TOKENS": "alice:short"}, "at least 16 characters"),
        ({"GATEWAY_CONSOLE_TOKENS": "al ice:" + "x" * 16}, "name:token[:ro]"),
        ({"GATEWAY_CONSOLE_TOKENS": "alice:" + "x" * 16 + ":admin"}, "ro (read-only)"),
        ({"GATEWAY_CONSOLE_TOKENS": f"a:{'x' * 16},b:{'x' * 16}"}, "given twice"),
        ({"GATEWAY_CONSOLE_PORT": "8080", "GATEWAY_CONSOLE_TOKENS": "a:" + "x" * 16}, "must differ"),
    ],
)
def test_console_settings_are_checked(env: dict[str, str], problem: str) -> None:
    with pytest.raises(SettingsError) as err:
        Settings.from_env(env)
    assert problem in str(err.value)
    assert "x" * 16 not in str(err.value)  # a token is never echoed


def test_console_tokens_parse_and_stay_secret() -> None:
    s = Settings.from_env({"GATEWAY_CONSOLE_PORT": "8081", "GATEWAY_CONSOLE_TOKENS": f"alice:{'t' * 20}:ro"})
    assert s.console_tokens == (("alice", "t" * 20, "ro"),)
    assert "t" * 20 in s.secret_values()
    assert "t" * 20 not in str(s.redacted())


def test_counts_at_the_cap_read_as_at_least() -> None:
    got = console.needs(replace(QUIET, outbox_review=10_000, dead_events=3), cap=10_000)
    assert [n.what for n in got] == ["10000+ send(s) wait for review", "3 dead item(s)"]


T0 = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
DAY = T0.date()


def _d(event: int, name: str, state: str, minute: int | None) -> dict[str, object]:
    at = None if minute is None else T0 + timedelta(minutes=minute)
    return {"event_id": event, "name": name, "state": state, "at": at, "detail": f"{state}@{minute}"}


@pytest.mark.parametrize(
    ("rows", "shown"),
    [
        ([], []),
        # A queued delivery (pending or failed) wins over the attempts delivered before a replay.
        ([_d(1, "crm", "delivered", 5), _d(1, "crm", "pending", 1)], [("crm", "pending@1")]),
        ([_d(1, "crm", "failed", 1), _d(1, "crm", "delivered", 9)], [("crm", "failed@1")]),
        # Else the last delivered attempt; a queued one with no due time still wins.
        ([_d(1, "crm", "delivered", 2), _d(1, "crm", "delivered", 7), _d(1, "crm", "delivered", 3)],
         [("crm", "delivered@7")]),
        ([_d(1, "crm", "delivered", 2), _d(1, "crm", "pending", None)], [("crm", "pending@None")]),
        # One line per event row and destination, by event then destination.
        ([_d(2, "bot", "delivered", 1), _d(1, "crm", "delivered", 1), _d(1, "bot", "pending", 1)],
         [("bot", "pending@1"), ("crm", "delivered@1"), ("bot", "delivered@1")]),
    ],
)  # fmt: skip
def test_a_storys_deliveries(rows: list[dict[str, object]], shown: list[tuple[str, str]]) -> None:
    got = console.story_deliveries(rows)
    assert [(r["name"], r["detail"]) for r in got] == shown
    assert all(r["what"] == "delivery" for r in got)


def test_a_page_of_deliveries_gets_its_events_on_all_three_keys() -> None:
    rows = [
        {"id": 7, "event_day": DAY, "lane": 3, "state": "pending"},
        {"id": 7, "event_day": DAY, "lane": 4, "state": "failed"},  # same id, another lane
        {"id": 8, "event_day": DAY, "lane": 3, "state": "delivered"},  # its day dropped
    ]
    events = [
        {"id": 7, "day": DAY, "lane": 3, "event_key": "msg:a", "kind": "message", "webhook_id": "wh_a"},
        {"id": 7, "day": DAY, "lane": 4, "event_key": "msg:b", "kind": "message", "webhook_id": "wh_b"},
        {
            "id": 8,
            "day": DAY - timedelta(days=1),
            "lane": 3,
            "event_key": "c",
            "kind": "x",
            "webhook_id": "c",
        },
    ]
    got = console.with_events(rows, events)
    assert [(r["state"], r["event_key"], r["webhook_id"]) for r in got] == [
        ("pending", "msg:a", "wh_a"),
        ("failed", "msg:b", "wh_b"),
        ("delivered", None, None),
    ]
