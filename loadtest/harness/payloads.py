"""Realistic Meta and Tenashi webhook deliveries, signed, with the event keys each one carries.

Pure: no I/O. Every value comes from a seeded RNG plus a per-run tag, so a (seed, run_tag)
pair replays byte for byte while two runs never reuse a wamid or event id. The keys follow
the consumers' rules: ``msg:<wamid>``, ``status:<wamid>:<status>:<participant>``, ``evt:<id>``.
"""

from __future__ import annotations

import base64
import json
import random
import time
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from typing import Any

from gateway.core.events import UNTIMED_DAY
from gateway.core.signature import sign_meta, sign_tenashi
from gateway.testing import payloads

META_PATH = "/webhooks/meta"
TENASHI_PATH = "/webhooks/tenashi"

NAMES = ("Jörg", "Zoë", "Ana María", "李雷", "Priya", "Dmitrí", "Ola 😀", "Søren")
TEXTS = (
    "Hi, where is my order?",
    "Grüße aus München 👋",
    "Can I change the delivery address to 12/B Main St?",
    "ok",
    "Merci beaucoup ! Ça marche.",
    "https://example.com/track?id=1042&x=y",
    "Preis: 19,99 €",
    "🙏🙏",
)
STATUSES = ("sent", "delivered", "read")


@dataclass(frozen=True, slots=True)
class Delivery:
    """One webhook POST as the provider would send it."""

    source: str  # 'meta' | 'tenashi'
    path: str
    body: bytes
    headers: tuple[tuple[str, str], ...]
    keys: tuple[str, ...]  # event keys a consumer must process exactly once
    msg_wamids: tuple[str, ...] = ()  # inbound messages (side effect: inbound_messages)
    # Statuses (side effect: message_statuses): ``status_row``s, a key and its event day.
    status_keys: tuple[str, ...] = ()
    signed_ok: bool = True
    kind: str = ""
    wire: bytes = field(default=b"", repr=False, compare=False)


def status_row(key: str, day: date) -> str:
    """A status's side effect as the gateway counts it: one message_statuses row per key and
    event day. A status key repeated with a timestamp on another day is another event."""
    return f"{key}@{day.isoformat()}"


def meta_event_day(timestamp: object) -> date:
    """The event day of a Meta status, by the rule the gateway documents: the UTC day of its
    timestamp when that is Unix seconds in ASCII digits, else the untimed day."""
    if isinstance(timestamp, str) and timestamp.isascii() and timestamp.isdigit():
        return datetime.fromtimestamp(int(timestamp), UTC).date()
    return UNTIMED_DAY


def status_key_of(row: str) -> str:
    """The dedup key of a ``status_row``."""
    return row.rsplit("@", 1)[0]


def meta_json(payload: dict[str, Any]) -> bytes:
    """Serialise as Meta does: non-ASCII as \\uXXXX (surrogate pairs for emoji) and '/' escaped."""
    return payloads.meta_bytes(payload, escape_slash=True)


def http_request(
    path: str, headers: tuple[tuple[str, str], ...], body: bytes, host: str = "gateway"
) -> bytes:
    """The exact HTTP/1.1 bytes of a keep-alive POST, built once before the run."""
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


@dataclass(frozen=True, slots=True)
class Secrets:
    meta: str
    tenashi: str
    tenashi_header: str = "X-Tenashi-Signature"
    tenashi_scheme: str = "hmac-sha256-hex"
    tenashi_prefix: str = "sha256="


class PayloadFactory:
    """Builds deliveries; ``seed`` fixes the content but for the events' times (``ts``), ``run_tag``
    keeps ids unique across runs."""

    def __init__(self, secrets: Secrets, seed: int = 1, run_tag: str = "run0") -> None:
        self.secrets = secrets
        self.rng = random.Random(f"{seed}:{run_tag}")
        self._tag = run_tag.encode()[:12]
        self._n = 0
        # Meta stamps an event with its own time, seconds before it is sent: a key lives in the
        # partition of its event's day, so timestamps of a fixed past day would put every key
        # of a run in the default partition, which live traffic reaches only with timestamps
        # days away from any partition.
        self._t0 = int(time.time())
        self.phone_number_id = str(100000000000000 + self.rng.randrange(10**14))
        self.waba_id = str(200000000000000 + self.rng.randrange(10**14))
        # Outbound wamids our side "sent", so statuses refer to plausible messages.
        self._outbound: list[str] = []

    # ---- ids -------------------------------------------------------------------------------
    def _next(self) -> int:
        self._n += 1
        return self._n

    def wamid(self) -> str:
        raw = b"\x15\x02\x00\x11\x18\x12" + self._tag + b"." + self._next().to_bytes(8, "big")
        return "wamid." + base64.b64encode(raw).decode()

    def wa_id(self) -> str:
        return f"{self.rng.choice((49, 44, 1, 91, 55))}{self.rng.randrange(10**9, 10**10)}"

    def tenashi_event_id(self) -> str:
        return f"evt_{self.rng.getrandbits(32):08x}{self._next():016x}"

    def ts(self) -> str:
        """Now (when the factory was made), a second later every thousand ids."""
        return str(self._t0 + self._n // 1000)

    # ---- Meta envelope ---------------------------------------------------------------------
    def _value(self, **parts: Any) -> dict[str, Any]:
        value = payloads.meta_value(phone_number_id=self.phone_number_id)
        value.update(parts)
        return value

    def _envelope(self, changes_per_entry: list[list[dict[str, Any]]]) -> dict[str, Any]:
        return payloads.meta_envelope(
            [(self.waba_id, [("messages", v) for v in values]) for values in changes_per_entry]
        )

    def _meta_delivery(self, payload: dict[str, Any], kind: str, good: bool = True) -> Delivery:
        body = meta_json(payload)
        keys: list[str] = []
        statuses: list[str] = []
        for entry in payload["entry"]:
            for change in entry["changes"]:
                value = change["value"]
                keys += [f"msg:{m['id']}" for m in value.get("messages", [])]
                for s in value.get("statuses", []):
                    key = f"status:{s['id']}:{s['status']}:{s.get('recipient_participant_id', '')}"
                    keys.append(key)
                    statuses.append(status_row(key, meta_event_day(s.get("timestamp"))))
        msgs = [k for k in keys if k.startswith("msg:")]
        secret = self.secrets.meta if good else self.secrets.meta + "-wrong"
        headers = (
            ("Content-Type", "application/json"),
            ("X-Hub-Signature-256", sign_meta(body, secret)),
        )
        return Delivery(
            "meta",
            META_PATH,
            body,
            headers,
            tuple(keys) if good else (),
            tuple(k[4:] for k in msgs) if good else (),
            tuple(statuses) if good else (),
            good,
            kind,
            http_request(META_PATH, headers, body),
        )

    # ---- inbound message objects -----------------------------------------------------------
    def _msg(self, typ: str, content: dict[str, Any], sender: str, reply: bool = False) -> dict[str, Any]:
        m: dict[str, Any] = {"from": sender, "id": self.wamid(), "timestamp": self.ts(), "type": typ}
        m.update(content)
        if reply and self._outbound:
            m["context"] = {"from": "15550001111", "id": self.rng.choice(self._outbound)}
        return m

    def _media(self, mime: str) -> dict[str, Any]:
        return {
            "mime_type": mime,
            "sha256": base64.b64encode(self.rng.randbytes(32)).decode(),
            "id": str(self.rng.randrange(10**15, 10**16)),
        }

    def message_object(self, typ: str, sender: str) -> dict[str, Any]:
        r = self.rng
        reply = r.random() < 0.2
        if typ == "text":
            return self._msg("text", {"text": {"body": r.choice(TEXTS)}}, sender, reply)
        if typ == "image":
            return self._msg("image", {"image": {**self._media("image/jpeg"), "caption": "Foto 📷"}}, sender)
        if typ == "document":
            doc = {**self._media("application/pdf"), "filename": "Rechnung_1042.pdf"}
            return self._msg("document", {"document": doc}, sender)
        if typ == "audio":
            return self._msg(
                "audio", {"audio": {**self._media("audio/ogg; codecs=opus"), "voice": True}}, sender
            )
        if typ == "sticker":
            return self._msg("sticker", {"sticker": {**self._media("image/webp"), "animated": False}}, sender)
        if typ == "location":
            loc = {
                "latitude": round(r.uniform(-60, 60), 6),
                "longitude": round(r.uniform(-180, 180), 6),
                "name": "Café Zentral",
                "address": "Herrengasse 14, 1010 Wien",
            }
            return self._msg("location", {"location": loc}, sender)
        if typ == "contacts":
            contact = {"name": {"formatted_name": r.choice(NAMES)}, "phones": [{"phone": "+" + self.wa_id()}]}
            return self._msg("contacts", {"contacts": [contact]}, sender)
        if typ == "interactive":
            if r.random() < 0.5:
                inter = {"type": "button_reply", "button_reply": {"id": "yes-1042", "title": "Ja ✅"}}
            else:
                inter = {
                    "type": "list_reply",
                    "list_reply": {"id": "slot-3", "title": "Tomorrow 10:00", "description": "10\u201312 h"},
                }
            return self._msg("interactive", {"interactive": inter}, sender, reply=True)
        if typ == "button":
            return self._msg("button", {"button": {"payload": "STOP", "text": "Stop promotions"}}, sender)
        if typ == "reaction":
            target = r.choice(self._outbound) if self._outbound else self.wamid()
            return self._msg("reaction", {"reaction": {"message_id": target, "emoji": "👍"}}, sender)
        raise ValueError(f"unknown message type {typ!r}")

    # ---- Meta deliveries -------------------------------------------------------------------
    def inbound(self, typ: str = "text", good: bool = True) -> Delivery:
        sender = self.wa_id()
        value = self._value(
            contacts=[{"profile": {"name": self.rng.choice(NAMES)}, "wa_id": sender}],
            messages=[self.message_object(typ, sender)],
        )
        return self._meta_delivery(self._envelope([[value]]), f"inbound_{typ}", good)

    def _status(
        self, wamid: str, status: str, recipient: str, participant: str | None = None
    ) -> dict[str, Any]:
        s: dict[str, Any] = {"id": wamid, "status": status, "timestamp": self.ts(), "recipient_id": recipient}
        if participant is not None:
            s["recipient_type"] = "group"
            s["recipient_participant_id"] = participant
        if status != "read":
            s["conversation"] = {"id": self.rng.randbytes(16).hex(), "origin": {"type": "utility"}}
            s["pricing"] = {"billable": True, "pricing_model": "PMP", "category": "utility"}
        if status == "failed":
            s["errors"] = [
                {
                    "code": 131026,
                    "title": "Message undeliverable",
                    "message": "Message undeliverable",
                    "error_data": {"details": "Receiver is incapable of receiving this message"},
                }
            ]
        return s

    def outbound_wamid(self) -> str:
        w = self.wamid()
        self._outbound.append(w)
        if len(self._outbound) > 512:
            del self._outbound[:256]
        return w

    def status(self, status: str | None = None, good: bool = True) -> Delivery:
        """One status of one outbound message; reuses a recent wamid so lifecycles interleave."""
        r = self.rng
        wamid = r.choice(self._outbound) if self._outbound and r.random() < 0.6 else self.outbound_wamid()
        st = status or r.choice(STATUSES)
        value = self._value(statuses=[self._status(wamid, st, self.wa_id())])
        return self._meta_delivery(self._envelope([[value]]), f"status_{st}", good)

    def group_status(self, participants: int = 3, good: bool = True) -> Delivery:
        """One group message, one status type, several participants (one status object each)."""
        wamid = self.outbound_wamid()
        group = f"{self.rng.randrange(10**17, 10**18)}@g.us"
        st = self.rng.choice(STATUSES)
        objs = [self._status(wamid, st, group, self.wa_id()) for _ in range(participants)]
        return self._meta_delivery(self._envelope([[self._value(statuses=objs)]]), "group_status", good)

    def batched(self, entries: int = 2, changes: int = 2, good: bool = True) -> Delivery:
        """Several entries with several changes, mixing messages and statuses."""
        r = self.rng
        per_entry: list[list[dict[str, Any]]] = []
        for _ in range(entries):
            values = []
            for _ in range(changes):
                if r.random() < 0.5:
                    sender = self.wa_id()
                    msgs = [
                        self.message_object(r.choice(("text", "image", "location")), sender) for _ in range(2)
                    ]
                    values.append(
                        self._value(
                            contacts=[{"profile": {"name": r.choice(NAMES)}, "wa_id": sender}], messages=msgs
                        )
                    )
                else:
                    sts = [
                        self._status(self.outbound_wamid(), r.choice(STATUSES), self.wa_id())
                        for _ in range(2)
                    ]
                    values.append(self._value(statuses=sts))
            per_entry.append(values)
        return self._meta_delivery(self._envelope(per_entry), "batched", good)

    def account_errors(self) -> Delivery:
        """A change with only account-level errors: stored, but no event key."""
        err = {"code": 131047, "title": "Re-engagement message", "message": "Re-engagement message"}
        return self._meta_delivery(self._envelope([[self._value(errors=[err])]]), "account_errors")

    # ---- Tenashi ---------------------------------------------------------------------------
    def tenashi(self, typ: str = "message.status", good: bool = True) -> Delivery:
        r = self.rng
        evt = self.tenashi_event_id()
        data: dict[str, Any]
        if typ == "message.status":
            data = {
                "message_id": f"tn_msg_{r.getrandbits(64):016x}",
                "status": r.choice(("sent", "delivered", "read", "failed")),
                "idempotency_key": f"order-{r.randrange(10**6)}-shipped",
                "recipient": "+" + self.wa_id(),
                "errors": [],
            }
        elif typ == "message.received":
            data = {
                "message_id": f"tn_in_{r.getrandbits(64):016x}",
                "from": "+" + self.wa_id(),
                "type": "text",
                "text": {"body": r.choice(TEXTS)},
                "timestamp": self.ts(),
            }
        else:
            data = {"number": "+15550001111", "state": "linked"}
        # Tenashi's serialisation is unpublished: sent unescaped (UTF-8), unlike Meta's.
        event = payloads.tenashi_event(evt, typ, data, created=int(self.ts()))
        body = json.dumps(event, ensure_ascii=False).encode()
        s = self.secrets
        secret = s.tenashi if good else s.tenashi + "-wrong"
        headers = (
            ("Content-Type", "application/json"),
            ("X-Tenashi-Delivery", evt),
            (s.tenashi_header, sign_tenashi(body, secret, s.tenashi_scheme, s.tenashi_prefix)),
        )
        keys = (f"evt:{evt}",) if good else ()
        return Delivery(
            "tenashi",
            TENASHI_PATH,
            body,
            headers,
            keys,
            signed_ok=good,
            kind=f"tenashi_{typ}",
            wire=http_request(TENASHI_PATH, headers, body),
        )

    # ---- poison ----------------------------------------------------------------------------
    def poisoned(self) -> list[tuple[Delivery, tuple[str, ...]]]:
        """Signed bodies that once stopped every consumer, each with the events that must still
        be processed (its ``keys``) and the kinds of the dead items it must leave, with their
        bytes: a status whose timestamp is ``"²"`` (processed: the time is kept in the raw JSON
        only); a message whose id is 3 200 random characters (too large for an index row: dead
        at once, by the planner's key limit) beside a good message; a change nested 300 levels
        deep (dead at once) beside a good message; a Tenashi status ``created`` ``"³"`` (processed)."""
        r = self.rng
        sender = self.wa_id()
        good, huge = (
            self._msg("text", {"body": r.choice(TEXTS)}, sender),
            self._msg("text", {"body": "x"}, sender),
        )
        huge["id"] = "wamid." + base64.b64encode(r.randbytes(2400)).decode()
        odd = {**self._status(self.outbound_wamid(), "delivered", self.wa_id()), "timestamp": "²"}
        first = self._envelope([[self._value(messages=[good, huge], statuses=[odd])]])
        deep: Any = []
        for _ in range(300):
            deep = [deep]
        second_msg = self._msg("text", {"body": r.choice(TEXTS)}, sender)
        second = payloads.meta_envelope(
            [
                (
                    self.waba_id,
                    [("account_update", {"deep": deep}), ("messages", self._value(messages=[second_msg]))],
                )
            ]
        )
        evt = self.tenashi_event_id()
        data = {"message_id": f"tn_msg_{r.getrandbits(64):016x}", "status": "read", "recipient": "+" + sender}
        tenashi = self._tenashi_delivery(
            evt, {**payloads.tenashi_event(evt, "message.status", data), "created": "³"}
        )
        odd_key = f"status:{odd['id']}:delivered:"
        return [
            (
                self._raw_meta(
                    first,
                    (f"msg:{good['id']}", odd_key),
                    (status_row(odd_key, meta_event_day(odd["timestamp"])),),
                ),
                ("bad",),  # the planner refuses the giant's key: a fragment that is no event
            ),
            (self._raw_meta(second, (f"msg:{second_msg['id']}",)), ("bad",)),
            (tenashi, ()),
        ]

    def _raw_meta(
        self, payload: dict[str, Any], keys: tuple[str, ...], statuses: tuple[str, ...] = ()
    ) -> Delivery:
        """A Meta delivery serialised by the standard library (orjson stops at 254 levels)."""
        body = json.dumps(payload, separators=(",", ":")).encode()
        headers = (
            ("Content-Type", "application/json"),
            ("X-Hub-Signature-256", sign_meta(body, self.secrets.meta)),
        )
        msgs = tuple(k[4:] for k in keys if k.startswith("msg:"))
        return Delivery(
            "meta",
            META_PATH,
            body,
            headers,
            keys,
            msgs,
            statuses,
            True,
            "poison",
            http_request(META_PATH, headers, body),
        )

    def _tenashi_delivery(self, evt: str, event: dict[str, Any]) -> Delivery:
        body = json.dumps(event, ensure_ascii=False).encode()
        s = self.secrets
        headers = (
            ("Content-Type", "application/json"),
            ("X-Tenashi-Delivery", evt),
            (s.tenashi_header, sign_tenashi(body, s.tenashi, s.tenashi_scheme, s.tenashi_prefix)),
        )
        return Delivery(
            "tenashi",
            TENASHI_PATH,
            body,
            headers,
            (f"evt:{evt}",),
            kind="poison",
            wire=http_request(TENASHI_PATH, headers, body),
        )

    def with_bad_signature(self, d: Delivery) -> Delivery:
        """The same bytes signed under a wrong secret: must get 401 and leave no row."""
        s = self.secrets
        if d.source == "meta":
            header, bad = "X-Hub-Signature-256", sign_meta(d.body, s.meta + "-wrong")
        else:
            header = s.tenashi_header
            bad = sign_tenashi(d.body, s.tenashi + "-wrong", s.tenashi_scheme, s.tenashi_prefix)
        headers = tuple((k, bad if k == header else v) for k, v in d.headers)
        return Delivery(
            d.source,
            d.path,
            d.body,
            headers,
            (),
            signed_ok=False,
            kind="bad_signature",
            wire=http_request(d.path, headers, d.body),
        )
