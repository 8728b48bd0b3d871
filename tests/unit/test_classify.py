from typing import Any

import pytest

from gateway.core.backoff import backoff_delay
from gateway.core.classify import (
    NUMBER_CODES,
    PERMANENT_CODES,
    RETRYABLE_CODES,
    TOKEN_CODES,
    Classified,
    SendOutcome,
    Transport,
    classify_response,
    classify_transport,
    finalize,
    retry_delay_s,
)


def meta_err(code: int) -> dict[str, Any]:
    return {"error": {"message": "x", "type": "OAuthException", "code": code, "fbtrace_id": "A"}}


OK = {"messaging_product": "whatsapp", "messages": [{"id": "wamid.AAA"}]}


@pytest.mark.parametrize(
    ("provider", "status", "body", "state", "code", "wamid"),
    [
        ("meta", 200, OK, "accepted", None, "wamid.AAA"),
        ("meta", 200, {"messages": []}, "unknown", None, None),  # 2xx without id: may exist
        ("meta", 200, None, "unknown", None, None),
        ("meta", 500, None, "unknown", None, None),
        ("meta", 502, {"not": "meta"}, "unknown", None, None),
        ("meta", 503, meta_err(2), "pending", 2, None),  # the code wins over the HTTP status
        ("meta", 500, meta_err(131000), "pending", 131000, None),
        ("meta", 400, meta_err(130429), "pending", 130429, None),
        ("meta", 400, meta_err(131056), "pending", 131056, None),
        ("meta", 400, meta_err(131047), "failed", 131047, None),
        ("meta", 401, meta_err(190), "pending", 190, None),  # account-level: breaker, not failed
        ("meta", 403, meta_err(368), "pending", 368, None),
        ("meta", 400, meta_err(999999), "failed", 999999, None),  # unknown codes are final
        ("meta", 400, {"error": {"code": "100"}}, "failed", None, None),  # not an int code
        ("meta", 429, None, "pending", None, None),
        ("meta", 404, None, "failed", None, None),
        ("tenashi", 202, {"id": "msg_1", "status": "accepted"}, "accepted", None, "msg_1"),
        ("tenashi", 409, {"error": {"code": "idempotency_in_progress"}}, "pending", None, None),
        ("tenashi", 503, None, "pending", None, None),  # same key: safe to retry
        ("tenashi", 400, {"error": {"code": "invalid_request"}}, "failed", None, None),
        ("tenashi", 401, None, "pending", None, None),  # our token refused: breaker
    ],
)
def test_classify_response(
    provider: str, status: int, body: Any, state: str, code: int | None, wamid: str | None
) -> None:
    c = classify_response(provider, status, body)
    assert (c.state, c.code, c.wamid) == (state, code, wamid)


@pytest.mark.parametrize("code", sorted(RETRYABLE_CODES))
def test_every_retryable_code_retries(code: int) -> None:
    assert classify_response("meta", 400, meta_err(code)).outcome is SendOutcome.RETRY


@pytest.mark.parametrize("code", sorted(PERMANENT_CODES))
def test_every_permanent_code_fails(code: int) -> None:
    assert classify_response("meta", 400, meta_err(code)).outcome is SendOutcome.FAILED


@pytest.mark.parametrize(
    ("code", "breaker"),
    [*((c, "token") for c in sorted(TOKEN_CODES)), *((c, "number") for c in sorted(NUMBER_CODES))],
)
def test_account_level_codes_open_a_breaker_and_never_fail(code: int, breaker: str) -> None:
    c = classify_response("meta", 400, meta_err(code))
    assert (c.outcome, c.breaker, c.state) == (SendOutcome.RETRY, breaker, "pending")
    assert finalize(c, 1000, 8) == c  # no attempt limit turns it into failed


def test_code_sets_are_disjoint() -> None:
    sets = [RETRYABLE_CODES, PERMANENT_CODES, TOKEN_CODES, NUMBER_CODES]
    assert sum(len(s) for s in sets) == len(frozenset().union(*sets))


@pytest.mark.parametrize(
    ("failure", "provider", "state", "maybe_sent"),
    [
        (Transport.CONNECT_FAILED, "meta", "pending", False),
        (Transport.READ_TIMEOUT, "meta", "unknown", False),
        (Transport.CONNECTION_LOST, "meta", "unknown", False),
        (Transport.CONNECT_FAILED, "tenashi", "pending", False),
        (Transport.READ_TIMEOUT, "tenashi", "pending", True),
        (Transport.CONNECTION_LOST, "tenashi", "pending", True),
    ],
)
def test_classify_transport(failure: Transport, provider: str, state: str, maybe_sent: bool) -> None:
    c = classify_transport(failure, provider)
    assert (c.state, c.maybe_sent) == (state, maybe_sent)


@pytest.mark.parametrize(
    ("c", "attempts", "state"),
    [
        (Classified(SendOutcome.RETRY, code=131000), 3, "pending"),
        (Classified(SendOutcome.RETRY, code=131000), 8, "failed"),  # rejected every time: never sent
        (Classified(SendOutcome.RETRY, maybe_sent=True), 8, "unknown"),  # Tenashi timeouts: may have gone
        (Classified(SendOutcome.RETRY, reached=False), 50, "pending"),  # connect failures keep trying
        (Classified(SendOutcome.ACCEPTED, wamid="w"), 8, "accepted"),
        (Classified(SendOutcome.UNKNOWN), 1, "unknown"),
    ],
)
def test_finalize(c: Classified, attempts: int, state: str) -> None:
    assert finalize(c, attempts, 8).state == state


@pytest.mark.parametrize(
    ("code", "attempt", "jitter", "expected"),
    [
        (131000, 1, 0.0, backoff_delay(1, 1.0, 60.0, lambda: 0.0)),
        (131000, 3, 1.0, backoff_delay(3, 1.0, 60.0, lambda: 1.0)),
        (130429, 1, 0.0, backoff_delay(1, 10.0, 60.0, lambda: 0.0)),  # throughput limit: 10x base
        (131056, 1, 0.0, 6.0),  # pair limit: never before the pair interval
        (131056, 5, 1.0, backoff_delay(5, 1.0, 60.0, lambda: 1.0)),
    ],
)
def test_retry_delay(code: int, attempt: int, jitter: float, expected: float) -> None:
    c = classify_response("meta", 400, meta_err(code))
    assert retry_delay_s(c, attempt, 1.0, 60.0, 6.0, jitter) == pytest.approx(expected)


def test_slow_codes_wait_longer_than_others() -> None:
    normal = retry_delay_s(classify_response("meta", 400, meta_err(131000)), 1, 1.0, 60.0, 6.0, 0.5)
    for code in (130429, 131056):
        slow = retry_delay_s(classify_response("meta", 400, meta_err(code)), 1, 1.0, 60.0, 6.0, 0.5)
        assert slow > normal
