"""The operator console's pure parts: who a token is, login rate limits, page cursors, the
redirect after login, how a dead event's bytes are shown, and what on the overview needs a
person. No I/O."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import orjson


@dataclass(frozen=True, slots=True)
class Login:
    name: str
    read_only: bool
    fingerprint: str  # of the token: a session outlives neither its token nor a change of it


def fingerprint(token: str) -> str:
    return hashlib.sha256(b"gateway-console-token\0" + token.encode()).hexdigest()[:32]


def who(given: str, tokens: Sequence[tuple[str, str, str]]) -> Login | None:
    """The login whose token is ``given``, in constant time: every token is compared (as
    digests, so neither the length nor the first differing byte of any shows in the time)."""
    digest = hashlib.sha256(given.encode()).digest()
    found: Login | None = None
    for name, token, role in tokens:
        if hmac.compare_digest(digest, hashlib.sha256(token.encode()).digest()):
            found = Login(name, role == "ro", fingerprint(token))
    return found


def session_key(tokens: Sequence[tuple[str, str, str]]) -> bytes:
    """The key sessions are signed with, derived from every token: every process with the same
    configuration accepts the others' sessions, and changing the tokens ends them all."""
    material = "\n".join(sorted(f"{n}:{t}:{r}" for n, t, r in tokens)).encode()
    return hmac.new(b"gateway console session key v1", material, hashlib.sha256).digest()


def source_of(remote: str | None) -> str:
    """Whom a login's failures are counted against: its IPv4 address, or the /64 of its IPv6
    address (what one host or customer line is given, so a host cannot dodge the limit by
    walking its own network); an IPv4-mapped IPv6 address is its IPv4 address."""
    if not remote:
        return "?"
    try:
        ip = ipaddress.ip_address(remote.split("%", 1)[0])
    except ValueError:
        return remote
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


def token_key(given: str) -> str:
    """What a presented token's failures are counted under: a digest, so the wrong tokens tried
    (typos of real ones among them) are not kept in memory as they were typed."""
    return hashlib.sha256(b"gateway-console-attempt\0" + given.encode()).hexdigest()[:32]


class FailureLimit:
    """Failed logins allowed within a sliding window, per source (``source_of``) and per
    presented token (``token_key``): a source that failed too often waits, whatever token it
    presents next, and so does a wrong token presented too often, from wherever. There is no
    limit over all failures: failures from other sources never lock out the right token
    presented from a source that has not failed (a right token is never counted).

    ``check_*`` say how many seconds to wait (0: go on). A source's attempt is counted when it
    begins (``begin``), before its form is read, and forgotten with the source's other failures
    when it logs in (``succeeded``): requests sent at once cannot all pass the check before the
    first of them is counted. ``failed`` counts a wrong token."""

    def __init__(
        self, per_source: int = 10, per_token: int = 10, window_s: float = 300.0, tracked: int = 100_000
    ) -> None:
        self.per_source = per_source
        self.per_token = per_token
        self.window_s = window_s
        self.tracked = tracked  # keys kept per table; the least recently failing go first
        self._sources: dict[str, deque[float]] = {}
        self._tokens: dict[str, deque[float]] = {}

    def check_source(self, source: str, now: float) -> float:
        return self._wait(self._sources, source, self.per_source, now)

    def check_token(self, key: str, now: float) -> float:
        return self._wait(self._tokens, key, self.per_token, now)

    def begin(self, source: str, now: float) -> None:
        self._count(self._sources, source, self.per_source, now)

    def failed(self, key: str, now: float) -> None:
        self._count(self._tokens, key, self.per_token, now)

    def succeeded(self, source: str) -> None:
        self._sources.pop(source, None)

    def _wait(self, table: dict[str, deque[float]], key: str, limit: int, now: float) -> float:
        q = table.get(key)
        if q is None:
            return 0.0
        while q and q[0] <= now - self.window_s:
            q.popleft()
        if not q:
            del table[key]
            return 0.0
        return q[0] + self.window_s - now if len(q) >= limit else 0.0

    def _count(self, table: dict[str, deque[float]], key: str, limit: int, now: float) -> None:
        # The last ``limit`` failures are all a wait needs: it ends when the oldest leaves the window.
        q = table.pop(key, None) or deque(maxlen=limit)
        q.append(now)
        table[key] = q  # last in the table's order: the most recent failure
        while len(table) > self.tracked:  # a flood of sources or tokens cannot grow it without bound
            del table[next(iter(table))]


def safe_next(raw: str | None) -> str:
    """Where to go after logging in: a path of this console only (never another site's,
    ``//host``, a scheme, or a backslash some browsers read as a slash)."""
    if not raw or not raw.startswith("/") or raw.startswith("//") or "\\" in raw:
        return "/"
    parts = urlsplit(raw)
    if parts.scheme or parts.netloc or any(ord(c) < 0x20 for c in raw):
        return "/"
    return raw


def parse_when(raw: str, now: datetime) -> datetime:
    """ISO 8601 (a time without an offset is UTC), or an age before ``now``: 30m, 2h, 7d.
    ValueError otherwise."""
    raw = raw.strip()
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    if raw[-1:] in units and raw.isascii() and raw[:-1].replace(".", "", 1).isdigit():
        return now - timedelta(seconds=float(raw[:-1]) * units[raw[-1]])
    try:
        value = datetime.fromisoformat(raw)
    except ValueError:
        raise ValueError(f"not a time: {raw!r} (ISO 8601, or 30m / 2h / 7d ago)") from None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


# --- cursors: an opaque "after" parameter naming the last row of a page -----------------------


def cursor(at: datetime | None, ident: int) -> str:
    """``<epoch microseconds>.<id>`` (or ``<id>`` alone for lists ordered by id)."""
    if at is None:
        return str(ident)
    return f"{int(at.timestamp() * 1_000_000)}.{ident}"


def parse_cursor(raw: str | None) -> tuple[datetime | None, int] | None:
    """The (time, id) of a cursor; None for none or a malformed one (the first page)."""
    if not raw or len(raw) > 40:
        return None
    left, dot, right = raw.partition(".")
    try:
        if not dot:
            return None, int(left)
        at = datetime.fromtimestamp(int(left) / 1_000_000, UTC)
        return at, int(right)
    except (ValueError, OverflowError, OSError):
        return None


# --- a dead event's bytes -------------------------------------------------------------------

SHOWN_BYTES = 256 * 1024  # shown on the page; the whole is downloadable


def pretty_json(data: bytes) -> str | None:
    """The bytes as indented JSON, or None when they are not JSON (or too large to show)."""
    if len(data) > SHOWN_BYTES:
        return None
    try:
        return orjson.dumps(orjson.loads(data), option=orjson.OPT_INDENT_2).decode()
    except orjson.JSONDecodeError:
        return None


def shown_text(data: bytes) -> tuple[str, bool]:
    """The bytes as text (undecodable bytes as U+FFFD), cut at SHOWN_BYTES; and whether cut."""
    cut = len(data) > SHOWN_BYTES
    return data[:SHOWN_BYTES].decode("utf-8", errors="replace"), cut


# --- the overview: what needs a person ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Need:
    level: str  # "critical" or "warning"
    what: str
    link: str


@dataclass(frozen=True, slots=True)
class Numbers:
    """What the overview reads from the database."""

    inbox_pending: int
    inbox_lag_s: float
    dead_rows: int
    dead_events: int
    outbox_review: int
    outbox_unknown: int
    outbox_failed: int
    failed_deliveries: int
    open_destination_breakers: int
    disabled_destinations: int
    open_sender_breakers: int
    partitions_ahead_days: int | None  # None: no partitioned table has a day partition
    maintenance_failing: bool  # the last pass failed, or none succeeded for a long time


def needs(n: Numbers, cap: int | None = None) -> list[Need]:
    """What a person should look at, the most urgent first (counts at ``cap`` read "cap+")."""

    def count(value: int, *parts: int) -> str:
        capped = cap is not None and any(p >= cap for p in parts or (value,))
        return f"{value}+" if capped else str(value)

    out: list[Need] = []
    if n.partitions_ahead_days is not None and n.partitions_ahead_days < 1:
        out.append(Need("critical", "no day partition ahead of today: ingest fails at midnight", "/"))
    if n.maintenance_failing:
        out.append(Need("critical", "the maintenance pass is failing", "/"))
    if n.inbox_lag_s > 60:
        out.append(Need("critical", f"consumers are {n.inbox_lag_s:.0f} s behind", "/"))
    if n.open_sender_breakers:
        out.append(Need("critical", f"{count(n.open_sender_breakers)} sender breaker(s) open", "/senders"))
    if n.open_destination_breakers:
        out.append(
            Need(
                "critical",
                f"{count(n.open_destination_breakers)} destination breaker(s) open",
                "/destinations",
            )
        )
    if n.outbox_review:
        out.append(
            Need("warning", f"{count(n.outbox_review)} send(s) wait for review", "/outbox?state=review")
        )
    if n.dead_rows or n.dead_events:
        out.append(
            Need(
                "warning",
                f"{count(n.dead_rows + n.dead_events, n.dead_rows, n.dead_events)} dead item(s)",
                "/dead",
            )
        )
    if n.failed_deliveries:
        out.append(Need("warning", f"{count(n.failed_deliveries)} failed deliveries", "/destinations"))
    if n.outbox_failed:
        out.append(Need("warning", f"{count(n.outbox_failed)} send(s) failed", "/outbox?state=failed"))
    if n.outbox_unknown:
        out.append(
            Need("warning", f"{count(n.outbox_unknown)} send(s) of unknown fate", "/outbox?state=unknown")
        )
    if n.disabled_destinations:
        out.append(
            Need("warning", f"{count(n.disabled_destinations)} destination(s) disabled", "/destinations")
        )
    if n.partitions_ahead_days is not None and n.partitions_ahead_days == 1:
        out.append(Need("warning", "only one day partition ahead of today", "/"))
    return out


def with_events(
    rows: Sequence[Mapping[str, Any]], events: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """A page of deliveries with their events' keys, kinds and webhook ids, matched on (id,
    day, lane); a delivery whose event row is gone (dropped with its day) keeps None there."""
    found = {(e["id"], e["day"], e["lane"]): e for e in events}
    out = []
    for r in rows:
        e = found.get((r["id"], r["event_day"], r["lane"]))
        out.append(
            dict(r)
            | {
                "event_key": e and e["event_key"],
                "kind": e and e["kind"],
                "webhook_id": e and e["webhook_id"],
            }
        )
    return out


QUEUED = frozenset({"pending", "failed"})


def story_deliveries(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One line per event row and destination of a message's story: its queued delivery, else
    its last delivered attempt; by event, then destination."""
    best: dict[tuple[int, str], Mapping[str, Any]] = {}
    for r in rows:
        at = (r["event_id"], r["name"])
        seen = best.get(at)
        if seen is None or _rank(r) > _rank(seen):
            best[at] = r
    return [
        {"what": "delivery", "name": r["name"], "state": r["state"], "at": r["at"], "detail": r["detail"]}
        for _, r in sorted(best.items(), key=lambda kv: kv[0])
    ]


def _rank(r: Mapping[str, Any]) -> tuple[bool, datetime]:
    return (r["state"] in QUEUED, r["at"] or datetime.min.replace(tzinfo=UTC))
