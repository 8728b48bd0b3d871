import base64
import hashlib
import hmac

import pytest

from gateway.core.signature import (
    meta_header_ok,
    sign_meta,
    sign_tenashi,
    tenashi_header_ok,
    verify_meta,
    verify_tenashi,
)

BODY = b'{"text":"Gr\\u00fc\\u00dfe \\/ \\ud83d\\ude00"}'
S1, S2 = "secret-one", "secret-two"


def hexsig(body: bytes, secret: str) -> str:
    return hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


@pytest.mark.parametrize(
    ("header", "secrets", "ok"),
    [
        ("sha256=" + hexsig(BODY, S1), (S1,), True),
        ("sha256=" + hexsig(BODY, S1).upper(), (S1,), True),  # hex case is not significant
        ("sha256=" + hexsig(BODY, S2), (S1, S2), True),  # rotation: any configured secret
        ("sha256=" + hexsig(BODY, S2), (S1,), False),
        ("sha256=" + hexsig(BODY + b" ", S1), (S1,), False),
        ("sha1=" + hexsig(BODY, S1), (S1,), False),
        (hexsig(BODY, S1), (S1,), False),
        ("sha256=" + hexsig(BODY, S1)[:-1], (S1,), False),
        ("sha256=" + "g" * 64, (S1,), False),
        ("sha256=", (S1,), False),
        ("", (S1,), False),
        (None, (S1,), False),
        ("sha256=" + hexsig(BODY, S1), (), False),  # no secrets configured: nothing verifies
    ],
)
def test_verify_meta(header: str | None, secrets: tuple[str, ...], ok: bool) -> None:
    assert verify_meta(BODY, header, secrets) is ok


def test_sign_meta_round_trip() -> None:
    assert sign_meta(BODY, S1) == "sha256=" + hexsig(BODY, S1)
    assert verify_meta(BODY, sign_meta(BODY, S1), (S1,))


@pytest.mark.parametrize(
    ("scheme", "prefix", "header", "ok"),
    [
        ("hmac-sha256-hex", "sha256=", "sha256=" + hexsig(BODY, S1), True),
        ("hmac-sha256-hex", "", hexsig(BODY, S1), True),
        ("hmac-sha256-hex", "sha256=", hexsig(BODY, S1), False),
        (
            "hmac-sha256-base64",
            "",
            base64.b64encode(hmac.new(S1.encode(), BODY, hashlib.sha256).digest()).decode(),
            True,
        ),
        ("hmac-sha256-base64", "", "not base64!", False),
        ("hmac-sha256-base64", "", base64.b64encode(b"short").decode(), False),
    ],
)
def test_verify_tenashi(scheme: str, prefix: str, header: str, ok: bool) -> None:
    assert verify_tenashi(BODY, header, S1, scheme, prefix) is ok
    if ok:
        assert sign_tenashi(BODY, S1, scheme, prefix) == header or scheme == "hmac-sha256-hex"


def test_verify_tenashi_without_secret_refuses() -> None:
    assert not verify_tenashi(BODY, "sha256=" + hexsig(BODY, ""), "")


@pytest.mark.parametrize(
    ("header", "ok"),
    [
        ("sha256=" + "ab" * 32, True),
        (" SHA256=" + "AB" * 32 + " ", True),
        ("sha256=" + "ab" * 31, False),
        ("sha256=" + "zz" * 32, False),
        ("sha1=" + "ab" * 32, False),
        ("ab" * 32, False),
        ("", False),
        (None, False),
    ],
)
def test_meta_header_shape_is_checked_without_the_body(header: str | None, ok: bool) -> None:
    assert meta_header_ok(header) is ok
    if ok:  # a well-formed header is exactly one that verify_meta could accept
        assert verify_meta(b"x", header, (S1,)) is False


@pytest.mark.parametrize(
    ("header", "scheme", "prefix", "ok"),
    [
        ("sha256=" + "ab" * 32, "hmac-sha256-hex", "sha256=", True),
        ("ab" * 32, "hmac-sha256-hex", "", True),
        ("sha256=" + "ab" * 32, "hmac-sha256-hex", "v1=", False),
        ("sha256=" + base64.b64encode(b"k" * 32).decode(), "hmac-sha256-base64", "sha256=", True),
        ("sha256=" + base64.b64encode(b"k" * 31).decode(), "hmac-sha256-base64", "sha256=", False),
        ("sha256=!!!!", "hmac-sha256-base64", "sha256=", False),
        (None, "hmac-sha256-hex", "sha256=", False),
    ],
)
def test_tenashi_header_shape(header: str | None, scheme: str, prefix: str, ok: bool) -> None:
    assert tenashi_header_ok(header, scheme, prefix) is ok
