"""What a send attempt's outcome means for its outbox row. Pure: no I/O.

The rule that matters: a send the provider may have accepted is never retried blindly.
Meta has no idempotency key, so "may have been accepted" becomes ``unknown`` and waits for a
status webhook or the reconciler. Tenashi replays a repeated Idempotency-Key within 24 h,
so for Tenashi the same outcomes are retried with the same key (``pending``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from gateway.core.backoff import backoff_delay
from gateway.core.enums import OutboxState, Provider


class Transport(enum.Enum):
    """How a request failed below HTTP."""

    CONNECT_FAILED = "connect_failed"  # never reached the provider
    READ_TIMEOUT = "read_timeout"  # sent; the answer did not come in time
    CONNECTION_LOST = "connection_lost"  # sent; the connection dropped before the answer


class SendOutcome(enum.Enum):
    ACCEPTED = "accepted"
    RETRY = "retry"  # row back to pending with backoff
    UNKNOWN = "unknown"
    FAILED = "failed"


# Meta's error-code reference ("WhatsApp error codes", developers.facebook.com/documentation/
# business-messaging/whatsapp/support/error-codes/): "retry later" codes; everything else with
# an error code is final, except the account-level codes below.
RETRYABLE_CODES = frozenset({2, 4, 80007, 130429, 131000, 131016, 131056, 131057, 133004})
PERMANENT_CODES = frozenset({100, 131026, 131047, 131048, 131050})
# Account-level codes (same reference): every message through the same token or number would
# get them too, so they open a circuit breaker and the row waits as pending, not failed.
# Token: 0 AuthException, 3 capability, 10 permission denied, 190 access token expired,
# 200-299 API permission.
TOKEN_CODES = frozenset({0, 3, 10, 190, *range(200, 300)})
# Number / business account: 368 temporarily blocked for policy violations, 131031 account
# locked, 131042 business eligibility (payment) issue, 131045 incorrect certificate
# (registration), 131037 display name needs approval, 133010 phone number not registered.
NUMBER_CODES = frozenset({368, 131031, 131037, 131042, 131045, 133010})
# Throughput (130429) and pair (131056) limits: retrying soon only hits the limit again.
SLOW_RETRY_FACTOR = {130429: 10.0, 131056: 1.0}


@dataclass(frozen=True, slots=True)
class Classified:
    outcome: SendOutcome
    code: int | None = None
    error: str | None = None
    wamid: str | None = None
    slow: bool = False  # retry with the longer backoff
    maybe_sent: bool = False  # a retry that the provider may already have acted on
    reached: bool = True  # False: the request never reached the provider
    breaker: str | None = None  # "token" | "number": an account-level error; opens that breaker
    # Meta's refusal as it answered it, {"status": <HTTP status>, "error": <its error object>}
    # (the Graph-compatible endpoint answers a failed send with it).
    refusal: dict[str, Any] | None = None

    @property
    def state(self) -> OutboxState:
        """The outbox state this outcome leads to."""
        return {
            SendOutcome.ACCEPTED: OutboxState.ACCEPTED,
            SendOutcome.RETRY: OutboxState.PENDING,
            SendOutcome.UNKNOWN: OutboxState.UNKNOWN,
            SendOutcome.FAILED: OutboxState.FAILED,
        }[self.outcome]


def classify_transport(failure: Transport, provider: str) -> Classified:
    if failure is Transport.CONNECT_FAILED:
        return Classified(SendOutcome.RETRY, error="connect failed", reached=False)
    error = "read timeout" if failure is Transport.READ_TIMEOUT else "connection lost"
    if provider == Provider.TENASHI:
        return Classified(SendOutcome.RETRY, error=error, maybe_sent=True)
    return Classified(SendOutcome.UNKNOWN, error=error)


def _meta_error(body: Any) -> tuple[int | None, str | None]:
    if not isinstance(body, dict):
        return None, None
    err = body.get("error")
    if not isinstance(err, dict):
        return None, None
    code = err.get("code")
    if not isinstance(code, int) or isinstance(code, bool):
        return None, None
    message = err.get("message")
    return code, str(message)[:500] if message is not None else None


# What is kept of Meta's error object (the fields its reference documents), each value bounded.
_ERROR_FIELDS = ("message", "type", "code", "error_subcode", "error_user_title", "error_user_msg",
                 "error_data", "fbtrace_id", "is_transient")  # fmt: skip
_MAX_KEPT = 1000


def _kept(err: dict[str, Any]) -> dict[str, Any]:
    """Meta's error object as it came, its documented fields only, strings cut at 1000 characters
    (an answer is input from the network)."""
    out: dict[str, Any] = {}
    for name in _ERROR_FIELDS:
        value = err.get(name)
        if isinstance(value, str):
            out[name] = value[:_MAX_KEPT]
        elif isinstance(value, bool | int | float):
            out[name] = value
        elif name == "error_data" and isinstance(value, dict):
            out[name] = {k[:100]: v[:_MAX_KEPT] for k, v in list(value.items())[:10]
                         if isinstance(k, str) and isinstance(v, str)}  # fmt: skip
    return out


def _meta_wamid(body: Any) -> str | None:
    if not isinstance(body, dict):
        return None
    messages = body.get("messages")
    if isinstance(messages, list) and messages and isinstance(messages[0], dict):
        wamid = messages[0].get("id")
        if isinstance(wamid, str) and wamid:
            return wamid
    return None


def classify_meta(status: int, body: Any) -> Classified:
    """A Graph API answer. The error code decides, not the HTTP status (Meta's error-code reference)."""
    if 200 <= status < 300:
        wamid = _meta_wamid(body)
        if wamid is None:
            # Accepted by HTTP but no id to match statuses with: the message may exist.
            return Classified(SendOutcome.UNKNOWN, error=f"HTTP {status} without a message id")
        return Classified(SendOutcome.ACCEPTED, wamid=wamid)
    code, message = _meta_error(body)
    if code is not None:
        error = message or f"error code {code}"
        refusal = {"status": status, "error": _kept(body["error"])}
        if code in RETRYABLE_CODES:
            return Classified(
                SendOutcome.RETRY, code=code, error=error, slow=code in SLOW_RETRY_FACTOR, refusal=refusal
            )
        if code in TOKEN_CODES:
            return Classified(SendOutcome.RETRY, code=code, error=error, breaker="token", refusal=refusal)
        if code in NUMBER_CODES:
            return Classified(SendOutcome.RETRY, code=code, error=error, breaker="number", refusal=refusal)
        return Classified(SendOutcome.FAILED, code=code, error=error, refusal=refusal)
    if status >= 500:
        return Classified(SendOutcome.UNKNOWN, error=f"HTTP {status}")
    if status == 429:
        return Classified(SendOutcome.RETRY, error="HTTP 429", slow=True)
    return Classified(SendOutcome.FAILED, error=f"HTTP {status} without an error code")


def classify_tenashi(status: int, body: Any) -> Classified:
    """Tenashi's API (our documented assumption): 202 accepted; 409 while the first attempt runs."""
    if 200 <= status < 300:
        msg_id = body.get("id") if isinstance(body, dict) else None
        if not isinstance(msg_id, str) or not msg_id:
            return Classified(SendOutcome.RETRY, error=f"HTTP {status} without a message id", maybe_sent=True)
        return Classified(SendOutcome.ACCEPTED, wamid=msg_id)
    if status == 409:
        return Classified(SendOutcome.RETRY, error="idempotency_in_progress", maybe_sent=True)
    if status in (401, 403):
        # Our token is refused: every send would be (an assumption: Tenashi documents no codes).
        return Classified(SendOutcome.RETRY, error=f"HTTP {status}", breaker="token")
    if status == 429:
        return Classified(SendOutcome.RETRY, error="HTTP 429", slow=True)
    if status >= 500:
        # Tenashi: retry server errors with the same key; a repeat never sends twice.
        return Classified(SendOutcome.RETRY, error=f"HTTP {status}", maybe_sent=True)
    code, message = _meta_error(body)
    return Classified(SendOutcome.FAILED, code=code, error=message or f"HTTP {status}")


def classify_response(provider: str, status: int, body: Any) -> Classified:
    if provider == Provider.TENASHI:
        return classify_tenashi(status, body)
    return classify_meta(status, body)


def finalize(c: Classified, attempts: int, max_attempts: int) -> Classified:
    """After ``max_attempts`` a retry stops: rejected sends fail; ones that may have gone are unknown.

    Connect failures never reached the provider and keep retrying at the capped backoff, so an
    outage of the provider does not fail every queued message; account-level errors wait for
    their breaker (and count no attempt).
    """
    if c.outcome is not SendOutcome.RETRY or attempts < max_attempts or not c.reached or c.breaker:
        return c
    if c.maybe_sent:
        return Classified(SendOutcome.UNKNOWN, code=c.code, error=f"{c.error}; gave up after {attempts}")
    return Classified(
        SendOutcome.FAILED,
        code=c.code,
        error=f"{c.error}; gave up after {attempts} attempts",
        refusal=c.refusal,
    )


def retry_delay_s(
    c: Classified, attempt: int, base_s: float, cap_s: float, pair_interval_s: float, jitter: float
) -> float:
    """Seconds before the next attempt; ``jitter`` in [0, 1) comes from the caller."""
    factor = SLOW_RETRY_FACTOR.get(c.code or 0, 10.0 if c.slow else 1.0)
    delay = backoff_delay(attempt, base_s * factor, max(cap_s, base_s * factor), lambda: jitter)
    if c.code == 131056:
        # Pair limit: nothing to that recipient before the pair interval has passed.
        delay = max(delay, pair_interval_s)
    return delay
