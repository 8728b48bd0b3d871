"""The Graph-compatible endpoint's vocabulary, without I/O: what a Graph API body asks for,
Meta's answers and Meta's error objects.

A bot written against Meta's Graph API (pywa, heyoo, plain HTTP) calls
``POST /{version}/{phone_number_id}/messages`` with Meta's own body and parses Meta's own
answer: ``{"messaging_product", "contacts": [{"input", "wa_id" | "user_id"}], "messages": [{"id"}]}``,
or on a refusal ``{"error": {"message", "type", "code", "error_subcode", "error_data",
"fbtrace_id"}}`` with Meta's HTTP status. Client libraries choose their exception classes by
``code`` (Meta's error-code reference), so each refusal here carries the code Meta uses for the
same situation: 100 invalid parameter, 100/33 an object the token may not use, 190 a bad access
token, 2500 an unknown path, 2 a temporary outage (retry).
"""

from __future__ import annotations

import re
from typing import Any

from gateway.core.enums import UnknownPolicy
from gateway.core.messages import DEFAULT_BOT, Message

# Graph API versions are vNN.N (v17.0, v23.0); any of that form is taken.
VERSION = re.compile(r"v[0-9]{1,3}\.[0-9]{1,2}")
# A send without an Idempotency-Key is one outbox row under a key of this form.
KEYLESS_PREFIX = "graph."
MAX_DETAIL = 1000


# A phone_number_id as the send API takes it (PhoneNumberId): it is put into the provider's URL.
PHONE_NUMBER_ID = re.compile(r"[0-9A-Za-z_-]{1,64}")


def version_ok(version: str) -> bool:
    return VERSION.fullmatch(version) is not None


def number_ok(phone_number_id: str) -> bool:
    return PHONE_NUMBER_ID.fullmatch(phone_number_id) is not None


def is_read_receipt(body: Any) -> bool:
    """Meta's "mark as read" body goes to the same path: ``{"status": "read", "message_id"}``."""
    return isinstance(body, dict) and "status" in body and "type" not in body


def with_default_type(body: Any) -> Any:
    """Meta's ``type`` defaults to ``text``: a body without one is a text message."""
    if isinstance(body, dict) and "type" not in body and "text" in body:
        return {**body, "type": "text"}
    return body


def message_of(body: dict[str, Any], phone_number_id: str) -> Message:
    """The message a valid Graph body (``GraphSendRequest``) asks ``phone_number_id`` to send."""
    kind = body["type"]
    to = body.get("to")
    context = body.get("context")
    return Message(
        # With both, "to" wins, as at Meta.
        to=to.lstrip("+") if to is not None else body["recipient"],
        phone_number_id=phone_number_id,
        message={"type": kind, kind: body[kind]},
        unknown_policy=UnknownPolicy.REVIEW,
        in_reply_to=context["message_id"] if isinstance(context, dict) else None,
        bot=DEFAULT_BOT,
        biz_opaque_callback_data=body.get("biz_opaque_callback_data"),
    )


def contact(body: dict[str, Any]) -> dict[str, str]:
    """Meta's ``contacts[0]``: the address as given, and whom it names (the phone number's
    digits, or the BSUID)."""
    to = body.get("to")
    if isinstance(to, str):
        return {"input": to, "wa_id": to.lstrip("+")}
    recipient = str(body.get("recipient"))
    return {"input": recipient, "user_id": recipient}


def sent(body: dict[str, Any], wamid: str) -> dict[str, Any]:
    """Meta's answer to an accepted send."""
    return {"messaging_product": "whatsapp", "contacts": [contact(body)], "messages": [{"id": wamid}]}


def queued(body: dict[str, Any], key: str, state: str, location: str) -> dict[str, Any]:
    """The answer when the outcome is not known within the wait: Meta's shape (clients that
    read ``messages[0].id`` and ``contacts[0]`` parse it), the id being the gateway's key, and
    where the final wamid will be."""
    return {
        "messaging_product": "whatsapp",
        "contacts": [contact(body)],
        "messages": [{"id": key}],
        "gateway": {"key": key, "state": state, "location": location},
    }


def error(
    code: int,
    message: str,
    *,
    type: str = "OAuthException",
    subcode: int | None = None,
    details: str | None = None,
    trace: str = "",
) -> dict[str, Any]:
    """Meta's error object."""
    err: dict[str, Any] = {"message": f"(#{code}) {message}", "type": type, "code": code}
    if subcode is not None:
        err["error_subcode"] = subcode
    if details:
        err["error_data"] = {"messaging_product": "whatsapp", "details": details[:MAX_DETAIL]}
    if trace:
        err["fbtrace_id"] = trace
    return {"error": err}


# The send flow's refusals (gateway.outbound.enqueue.Refused.kind) as Meta would answer the
# same situation: (HTTP status, code).
REFUSALS: dict[str, tuple[int, int]] = {
    "invalid": (400, 100),
    "no_inbound": (400, 100),
    "reused": (422, 100),
    "in_progress": (409, 100),
    "answered": (409, 100),
    "unavailable": (503, 2),
}


def refusal(kind: str, detail: str, trace: str = "") -> tuple[int, dict[str, Any]]:
    status, code = REFUSALS.get(kind, (400, 100))
    text = "Service temporarily unavailable" if code == 2 else "Invalid parameter"
    return status, error(code, text, details=detail, trace=trace)


def unknown_path(path: str, trace: str = "") -> tuple[int, dict[str, Any]]:
    return 400, error(2500, f"Unknown path components: {path[:200]}", trace=trace)


def bad_token(trace: str = "") -> tuple[int, dict[str, Any]]:
    return 401, error(190, "Invalid OAuth access token - Cannot parse access token", trace=trace)


def no_such_object(object_id: str, method: str = "post", trace: str = "") -> tuple[int, dict[str, Any]]:
    """A number (or media) the tenant may not use: as Meta answers for an object the token has
    no permission on (it does not say whether the object exists)."""
    return 400, error(
        100,
        f"Unsupported {method} request. Object with ID '{object_id[:100]}' does not exist, cannot be "
        "loaded due to missing permissions, or does not support this operation",
        type="GraphMethodException",
        subcode=33,
        trace=trace,
    )


def from_problem(status: int, problem: dict[str, Any], trace: str = "") -> tuple[int, dict[str, Any]]:
    """A problem document of the gateway's own endpoints (media, read receipts) as Meta's error:
    the same status, Meta's code for it (the Graph API's own code where Meta refused)."""
    detail = "; ".join(str(problem.get(k)) for k in ("title", "detail") if problem.get(k))
    given = problem.get("code")
    if status == 401:
        return bad_token(trace)
    if isinstance(given, int) and not isinstance(given, bool):
        return status, error(given, "Graph API error", details=detail, trace=trace)
    if status in (502, 503, 504):
        return status, error(2, "Service temporarily unavailable", details=detail, trace=trace)
    return status, error(100, "Invalid parameter", details=detail, trace=trace)


def provider_refusal(
    stored: Any, code: int | None, message: str | None, trace: str = ""
) -> tuple[int, dict[str, Any]]:
    """A send the provider refused for good: Meta's own status and error object as it answered
    (``stored``: ``{"status", "error"}``), else one built from the code and message kept."""
    if isinstance(stored, dict) and isinstance(stored.get("error"), dict):
        status = stored.get("status")
        err = dict(stored["error"])
        if trace:
            err["fbtrace_id"] = trace
        return (status if isinstance(status, int) and 400 <= status < 600 else 400), {"error": err}
    return 400, error(code if code is not None else 131000, message or "Message failed to send", trace=trace)
