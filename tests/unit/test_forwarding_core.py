"""Pure forwarding logic: Standard Webhooks signing, envelopes, outcomes, breaker counts, validation."""

from __future__ import annotations

import base64
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import orjson
import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from gateway.core import addresses, destinations, stdwebhooks
from gateway.core.delivery_outcomes import (
    MAX_RETRY_AFTER_S,
    DeliveryOutcome,
    DeliveryState,
    breaker_tally,
    decide,
    merge_tallies,
    parse_retry_after,
)
from gateway.core.destinations import check_name, check_url, conversation_of, kind_of, parse_events
from gateway.core.envelope import envelope
from gateway.core.parsing import parse
from gateway.core.planning import StagedRow, plan_batch
from gateway.store.deliveries import woken_by
from gateway.testing.payloads import (
    contact_obj,
    message_obj,
    messages_payload,
    meta_payload,
    meta_value,
    status_obj,
    statuses_payload,
    tenashi_event,
    to_bytes,
)

# The Standard Webhooks libraries' shared sign test vector (go/webhook_test.go TestWebhookSign,
# php/tests/WebhookTest.php testSignFunctionWorks, javascript/src/webhook.test.ts).
SPEC_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
SPEC_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
SPEC_TS = 1614265330
SPEC_BODY = b'{"test": 2432232314}'
SPEC_SIG = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def test_signature_matches_the_spec_vector() -> None:
    key = stdwebhooks.secret_key(SPEC_SECRET)
    assert stdwebhooks.signature(key, SPEC_ID, SPEC_TS, SPEC_BODY) == SPEC_SIG
    assert stdwebhooks.verify(key, SPEC_SIG, SPEC_ID, SPEC_TS, SPEC_BODY)
    # Rotation: any v1 signature in the space-separated list.
    assert stdwebhooks.verify(key, "v1,AAAA " + SPEC_SIG, SPEC_ID, SPEC_TS, SPEC_BODY)


@pytest.mark.parametrize(
    ("msg_id", "ts", "body"),
    [
        (SPEC_ID, SPEC_TS + 1, SPEC_BODY),
        ("msg_other", SPEC_TS, SPEC_BODY),
        (SPEC_ID, SPEC_TS, SPEC_BODY + b" "),
    ],
)
def test_signature_covers_id_timestamp_and_body(msg_id: str, ts: int, body: bytes) -> None:
    key = stdwebhooks.secret_key(SPEC_SECRET)
    assert not stdwebhooks.verify(key, SPEC_SIG, msg_id, ts, body)


def test_headers_verify_with_the_standardwebhooks_package() -> None:
    secret = stdwebhooks.generate_secret()
    body = orjson.dumps({"type": "message.received", "data": {"text": "Grüße 😀"}})
    ts = int(datetime.now(UTC).timestamp())
    headers = stdwebhooks.headers(stdwebhooks.secret_key(secret), "wh_abc", ts, body)
    assert Webhook(secret).verify(body, headers) == orjson.loads(body)
    with pytest.raises(WebhookVerificationError):
        Webhook(stdwebhooks.generate_secret()).verify(body, headers)


def test_during_a_rotation_either_secret_verifies_with_the_standardwebhooks_package() -> None:
    new, old = stdwebhooks.generate_secret(), stdwebhooks.generate_secret()
    body = b'{"n": 1}'
    ts = int(datetime.now(UTC).timestamp())
    headers = stdwebhooks.headers(
        stdwebhooks.secret_key(new), "wh_abc", ts, body, stdwebhooks.secret_key(old)
    )
    first, second = headers["webhook-signature"].split(" ")
    assert first.startswith("v1,") and second.startswith("v1,") and first != second
    assert Webhook(new).verify(body, headers) == {"n": 1}  # the receiver already switched
    assert Webhook(old).verify(body, headers) == {"n": 1}  # or not yet
    with pytest.raises(WebhookVerificationError):
        Webhook(stdwebhooks.generate_secret()).verify(body, headers)
    assert stdwebhooks.verify(stdwebhooks.secret_key(old), headers["webhook-signature"], "wh_abc", ts, body)


@pytest.mark.parametrize(
    "secret",
    [
        "",
        "whsec_",
        "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",  # no prefix
        "whsec_not base64!",
        "whsec_" + base64.b64encode(b"x" * 23).decode(),  # too short
        "whsec_" + base64.b64encode(b"x" * 65).decode(),  # too long
    ],
)
def test_bad_secrets_are_refused_without_echoing_them(secret: str) -> None:
    with pytest.raises(stdwebhooks.BadSecret) as info:
        stdwebhooks.secret_key(secret)
    if len(secret) > 10:
        assert secret[6:] not in str(info.value)


def test_generated_secrets_are_valid_random_and_masked() -> None:
    a, b = stdwebhooks.generate_secret(), stdwebhooks.generate_secret()
    assert a != b
    assert len(stdwebhooks.secret_key(a)) == 32
    masked = stdwebhooks.mask_secret(a)
    assert masked.endswith(a[-4:]) and a[6:-4] not in masked


@pytest.mark.parametrize("msg_id", ["", "has.dot", "x" * 201, "sp ace"])
def test_ids_that_could_confuse_the_signed_content_are_refused(msg_id: str) -> None:
    with pytest.raises(ValueError):
        stdwebhooks.signature(b"k" * 32, msg_id, 1, b"{}")


def test_webhook_id_is_stable_per_destination_and_event() -> None:
    a = stdwebhooks.webhook_id("crm", "msg:wamid.1")
    assert a == stdwebhooks.webhook_id("crm", "msg:wamid.1")
    assert a != stdwebhooks.webhook_id("bot", "msg:wamid.1")
    assert a != stdwebhooks.webhook_id("crm", "msg:wamid.2")
    assert a.startswith("wh_") and len(a) == 35 and "." not in a


# --- envelopes ----------------------------------------------------------------------------------


def test_message_envelope_has_normalised_fields_and_the_raw_fragment() -> None:
    msg = message_obj("wamid.M1", "hello", sender="4915100000001")
    (ev,) = parse("meta", to_bytes(messages_payload(msg)))
    env = envelope(ev, "meta")
    assert env["type"] == "message.received"
    assert env["event_key"] == "msg:wamid.M1"
    assert env["timestamp"] == "2025-11-30T00:00:00Z"
    assert env["data"] == {
        "wamid": "wamid.M1",
        "phone_number_id": "1111",
        "display_phone_number": "15550001111",
        "waba_id": "waba-0",
        "from": "4915100000001",
        "from_user_id": None,
        "from_parent_user_id": None,
        "username": None,
        "type": "text",
        "contact_name": "Ana",
        "contact": {"profile": {"name": "Ana"}, "wa_id": "4915100000001"},
    }
    assert env["raw"] == msg
    assert kind_of(ev) == "message" and conversation_of(ev) == "4915100000001"


@pytest.mark.parametrize(
    ("sent", "iso"),
    [
        ("0", "1970-01-01T00:00:00Z"),
        ("951782400", "2000-02-29T00:00:00Z"),
        ("2147483648", "2038-01-19T03:14:08Z"),
        ("99999999999", "5138-11-16T09:46:39Z"),  # the most digits the parser keeps
        ("100000000000", None),
        (2**37 - 1, "6325-04-08T15:04:31Z"),  # the largest number it keeps
        (2**37, None),
        ("-1", None),
        ("1e9", None),
    ],
)
def test_the_envelopes_timestamp_is_the_events_utc_time(sent: str | int, iso: str | None) -> None:
    msg = message_obj("wamid.T")
    msg["timestamp"] = sent
    (ev,) = parse("meta", to_bytes(messages_payload(msg)))
    assert envelope(ev, "meta")["timestamp"] == iso


def test_a_username_user_without_a_phone_number_is_named_by_bsuid() -> None:
    contact = contact_obj(None, "US.1349", username="ana.b", parent_user_id="US.ENT.118")
    msg = message_obj("wamid.U1", "hi", sender=None, user_id="US.1349")
    value = meta_value(messages=[msg], contacts=[contact])
    (ev,) = parse("meta", to_bytes(meta_payload(("messages", value))))
    data = envelope(ev, "meta")["data"]
    assert data["from"] is None and data["from_user_id"] == "US.1349"
    assert data["from_parent_user_id"] == "US.ENT.118" and data["username"] == "ana.b"
    assert data["contact"] == contact
    assert conversation_of(ev) == "US.1349"


def test_status_account_and_tenashi_envelopes() -> None:
    st = status_obj("wamid.S1", "failed", callback="cb", errors=[{"code": 131026}])
    (ev,) = parse("meta", to_bytes(statuses_payload(st)))
    env = envelope(ev, "meta")
    assert env["type"] == "message.status" and env["raw"] == st
    assert env["data"]["status"] == "failed" and env["data"]["callback_data"] == "cb"
    assert kind_of(ev) == "status" and conversation_of(ev) == "4915112345678"

    body = to_bytes(meta_payload(("messages", meta_value(errors=[{"code": 131000}]))))
    (err,) = parse("meta", body)
    assert envelope(err, "meta")["type"] == "account.error" and kind_of(err) == "account"
    assert conversation_of(err) == ""
    (upd,) = parse("meta", to_bytes(meta_payload(("message_template_status_update", {"event": "APPROVED"}))))
    assert envelope(upd, "meta")["raw"] == {"event": "APPROVED"} and kind_of(upd) == "account"

    t = tenashi_event("evt_1", "message.received", {"message_id": "tm1", "from": "49151", "type": "text"})
    (tev,) = parse("tenashi", to_bytes(t))
    env = envelope(tev, "tenashi")
    assert env["source"] == "tenashi" and env["event_key"] == "evt:evt_1" and env["data"]["from"] == "49151"


def test_plan_carries_one_forward_row_per_kept_event() -> None:
    body = to_bytes(messages_payload(message_obj("wamid.A"), message_obj("wamid.A"), message_obj("wamid.B")))
    plan = plan_batch([StagedRow(7, "meta", body, None)])
    assert [f["key"] for f in plan.forwards] == plan.keys == ["msg:wamid.A", "msg:wamid.B"]
    assert all(f["inbox_id"] == 7 and f["kind"] == "message" for f in plan.forwards)


def test_a_plan_without_forwarding_differs_only_in_having_no_forwards() -> None:
    body = to_bytes(messages_payload(message_obj("wamid.A"), message_obj("wamid.B")))
    rows = [StagedRow(7, "meta", body, None), StagedRow(8, "meta", b"{", None)]
    full, bare = plan_batch(rows), plan_batch(rows, forwarding=False)
    assert full.forwarding and len(full.forwards) == 2
    assert not bare.forwarding and bare.forwards == []
    for name in ("keys", "key_inbox", "key_days", "key_subjects", "rows", "links", "done", "parked", "kinds"):
        assert getattr(bare, name) == getattr(full, name), name


# --- outcomes -----------------------------------------------------------------------------------

NOW = 1_800_000_000.0


def _decide(status: int | None, retry_after: str | None = None, first: float = NOW, backoff: float = 2.0):  # type: ignore[no-untyped-def]
    return decide(
        status=status,
        error=None if status else "timeout",
        retry_after=retry_after,
        now=NOW,
        first_attempt_at=first,
        backoff_s=backoff,
        retry_window_s=3600,
    )


@pytest.mark.parametrize(
    ("status", "retry_after", "first", "outcome", "delay"),
    [
        (200, None, NOW, DeliveryOutcome.DELIVERED, None),
        (204, None, NOW, DeliveryOutcome.DELIVERED, None),
        (299, None, NOW, DeliveryOutcome.DELIVERED, None),
        (301, None, NOW, DeliveryOutcome.RETRY, 2.0),  # redirects are not followed
        (400, None, NOW, DeliveryOutcome.RETRY, 2.0),
        (410, None, NOW, DeliveryOutcome.GONE, 0.0),  # disables the destination; the delivery waits
        (410, None, NOW - 3599, DeliveryOutcome.GONE, 0.0),  # even at the window's end: nothing was refused
        (404, None, NOW, DeliveryOutcome.RETRY, 2.0),  # may be a deployment in progress
        (500, "120", NOW, DeliveryOutcome.RETRY, 2.0),  # Retry-After only on 429/503
        (429, "120", NOW, DeliveryOutcome.RETRY, 120.0),
        (503, "120", NOW, DeliveryOutcome.RETRY, 120.0),
        (503, "1", NOW, DeliveryOutcome.RETRY, 2.0),  # never sooner than our own backoff
        (503, "garbage", NOW, DeliveryOutcome.RETRY, 2.0),
        (None, None, NOW, DeliveryOutcome.RETRY, 2.0),  # timeout / refused
        (500, None, NOW - 3599, DeliveryOutcome.FAILED, None),  # window closes before the next attempt
        (429, "3000", NOW - 1000, DeliveryOutcome.FAILED, None),
    ],
)
def test_decide(
    status: int | None, retry_after: str | None, first: float, outcome: DeliveryOutcome, delay: float | None
) -> None:
    d = _decide(status, retry_after, first)
    assert d.outcome is outcome
    assert d.delay_s == delay
    assert (
        d.state
        is {
            DeliveryOutcome.DELIVERED: DeliveryState.DELIVERED,
            DeliveryOutcome.RETRY: DeliveryState.PENDING,
            DeliveryOutcome.FAILED: DeliveryState.FAILED,
            DeliveryOutcome.GONE: DeliveryState.PENDING,
        }[outcome]
    )
    if outcome is not DeliveryOutcome.DELIVERED:
        assert d.error


def test_retry_after_http_date_and_clamp() -> None:
    when = datetime.fromtimestamp(NOW, UTC) + timedelta(seconds=90)
    assert parse_retry_after(format_datetime(when, usegmt=True), NOW) == pytest.approx(90)
    assert parse_retry_after("999999999", NOW) == MAX_RETRY_AFTER_S
    assert parse_retry_after(format_datetime(when - timedelta(days=1), usegmt=True), NOW) == 0.0
    assert parse_retry_after(None, NOW) is None and parse_retry_after("-5", NOW) is None


@pytest.mark.parametrize(
    ("outcomes", "tally"),
    [
        ([], (False, 0)),
        ([True], (True, 0)),
        ([False, False], (False, 2)),
        ([False, True, False], (True, 1)),
        ([True, False, False, True], (True, 0)),
    ],
)
def test_breaker_tally(outcomes: list[bool], tally: tuple[bool, int]) -> None:
    assert breaker_tally(outcomes) == tally


# --- destination validation ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "url", ["https://bot.example/hooks", "http://127.0.0.1:9000/x?y=1", "http://[::1]:80/"]
)
def test_good_urls(url: str) -> None:
    assert check_url(url) == url


@pytest.mark.parametrize(
    "url",
    [
        "ftp://x/",
        "https://",
        "bot.example/hooks",
        "https://user:pw@bot.example/",
        "https://bot.example/#frag",
        "https://bot.example/ x",
        "https://bot.example:99999/",
        "https://b/" + "x" * 2000,
    ],
)
def test_bad_urls(url: str) -> None:
    with pytest.raises(ValueError):
        check_url(url)


def test_names_and_events() -> None:
    assert check_name("crm-1_a") == "crm-1_a"
    for bad in ("", "Crm", "-x", "a/b", "x" * 64):
        with pytest.raises(ValueError):
            check_name(bad)
    assert parse_events("status, message,message") == ["message", "status"]
    for bad in ("", ",", "message,orders"):
        with pytest.raises(ValueError):
            parse_events(bad)


@pytest.mark.parametrize(
    ("host", "refused"),
    [
        ("127.0.0.1", "loopback"),
        ("127.8.9.10", "loopback"),
        ("::1", "loopback"),
        ("[::1]", "loopback"),
        ("localhost", "loopback"),
        ("api.localhost.", "loopback"),
        ("169.254.169.254", "link-local"),  # cloud metadata
        ("fe80::1%eth0", "link-local"),
        ("10.0.0.1", "private"),
        ("172.16.5.4", "private"),
        ("192.168.1.1", "private"),
        ("100.64.0.1", "private"),  # shared address space
        ("fd00::1", "private"),
        ("::ffff:10.0.0.1", "private"),  # IPv4-mapped
        ("::ffff:127.0.0.1", "loopback"),
        ("0.0.0.0", "unspecified"),  # noqa: S104 - a string under test, no bind
        ("224.0.0.1", "multicast"),
        # IPv6 addresses that carry an IPv4 address are judged by it.
        ("[64:ff9b::7f00:1]", "carries 127.0.0.1, a loopback"),  # NAT64 well-known prefix
        ("64:ff9b::a9fe:a9fe", "carries 169.254.169.254, a link-local"),  # the metadata endpoint
        ("64:ff9b::a00:1", "carries 10.0.0.1, a private"),
        ("64:ff9b:1::a00:1", "local-use NAT64"),  # RFC 8215: never global
        ("64:ff9b:1:ffff::5db8:d70e", "local-use NAT64"),
        ("2002:7f00:1::1", "carries 127.0.0.1, a loopback"),  # 6to4
        ("2002:a9fe:a9fe::", "carries 169.254.169.254"),
        ("2001:0:4136:e378:8000:63bf:80ff:fffe", "carries"),  # Teredo, client 127.0.0.1 obfuscated
        ("::7f00:1", "carries 127.0.0.1, a loopback"),  # IPv4-compatible (deprecated)
        ("::ffff:0:7f00:1", "carries 127.0.0.1, a loopback"),  # SIIT IPv4-translated
        ("::ffff:169.254.169.254", "carries 169.254.169.254, a link-local"),
        ("64:ff9b::5db8:d70e", None),  # NAT64 of 93.184.215.14: fine
        ("2002:5db8:d70e::1", None),  # 6to4 of 93.184.215.14: fine
        ("93.184.215.14", None),
        ("2606:2800:21f:cb07:6820:80da:af6b:8b2c", None),
        ("crm.example.com", None),  # names: judged by what they resolve to
    ],
)
def test_private_destination_hosts_are_refused(host: str, refused: str | None) -> None:
    why = addresses.host_refused(host)
    if refused is None:
        assert why is None
    else:
        assert why is not None and refused in why


@pytest.mark.parametrize(
    ("first", "then"),
    [
        ([True], [False, False]),
        ([False, False, False], [True, False]),
        ([False, False, False], [False, False]),
        ([True, False], [True]),
        ([], [False]),
        ([False], []),
    ],
)
def test_merged_tallies_are_the_tally_of_both_rounds(first: list[bool], then: list[bool]) -> None:
    earlier = [(1, *breaker_tally(first))] if first else []
    later = [(1, *breaker_tally(then))] if then else []
    assert merge_tallies(earlier, later) == [(1, *breaker_tally(first + then))]


def test_merged_tallies_keep_each_destination() -> None:
    assert merge_tallies([(1, True, 0)], [(2, False, 1)]) == [(1, True, 0), (2, False, 1)]


@pytest.mark.parametrize(
    ("fmt", "secret", "ok"),
    [
        ("standard", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", True),
        ("standard", "0f1e2d3c4b5a69788796a5b4c3d2e1f0", False),  # an app secret is not whsec_
        ("meta", "0f1e2d3c4b5a69788796a5b4c3d2e1f0", True),  # a Meta app secret
        ("meta", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", True),  # any string
        ("meta", "", False),
        ("meta", " padded", False),  # would never verify on the bot's side
        ("meta", "tab\there", False),
        ("meta", "x" * 513, False),
        ("xml", "whatever", False),
    ],
)
def test_a_secret_is_checked_for_its_format(fmt: str, secret: str, ok: bool) -> None:
    if ok:
        assert destinations.check_secret(fmt, secret) == secret
    else:
        with pytest.raises(ValueError) as exc:
            destinations.check_secret(fmt, secret)
        assert secret not in str(exc.value) or not secret


def test_new_secrets_and_masks_per_format() -> None:
    meta = destinations.new_secret("meta")
    assert len(meta) == 32 and int(meta, 16) >= 0 and destinations.new_secret("meta") != meta
    assert destinations.check_secret("standard", destinations.new_secret("standard"))
    assert destinations.mask_secret("meta", meta) == f"…{meta[-4:]}"
    assert destinations.mask_secret("meta", "short") == "…"  # a short secret shows nothing
    assert destinations.mask_secret("standard", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw") == "whsec_…LaSw"


@pytest.mark.parametrize(
    ("token", "statement"),
    [
        ("0123abcd", "SET LOCAL gateway.forwarder = '0123abcd'"),
        ("f" * 32, f"SET LOCAL gateway.forwarder = '{'f' * 32}'"),
        ("", None),  # names nothing
        ("f" * 33, None),
        ("ABCD", None),  # Forwarder.token is lower-case hex
        ("ab'; DROP TABLE x; --", None),  # never spliced into the statement
        ("ab cd", None),
    ],
)
def test_the_statement_that_names_a_consumers_forwarder(token: str, statement: str | None) -> None:
    if statement is None:
        with pytest.raises(ValueError, match="hex digits"):
            woken_by(token)
    else:
        assert woken_by(token) == statement
