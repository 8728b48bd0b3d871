"""What an operator may do to the pipeline, for the command line and the console alike.

Each action runs in one transaction with its audit entry (``operator_actions``): an action
that happened has its entry, one that rolled back has none. An action refused (nothing to
do, or something that must not be done, such as releasing a send the provider accepted) is
recorded too, with no rows and the reason, after its transaction rolled back. The refusals
themselves are decided here and in the store functions called (their statements check and
change in one step); the front ends only render the results.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import asyncpg

from gateway.core import destinations
from gateway.core.enums import OutboxState
from gateway.core.pacing import BreakerId
from gateway.outbound.backfill import Backfilled, backfill
from gateway.store import audit, dead_events, deliveries, inbox, outbox, pacing
from gateway.store.deliveries import Tx

VIAS = ("console", "cli")
MAX_GRACE_H = 24 * 30


@dataclass(frozen=True, slots=True)
class Actor:
    """Who acts: a console token's name, or the command line's user (or its --actor)."""

    name: str
    via: str

    def __post_init__(self) -> None:
        if self.via not in VIAS:
            raise ValueError(f"via must be one of {VIAS}")
        if not self.name or len(self.name) > 100 or not self.name.isprintable():
            raise ValueError("an actor's name is 1..100 printable characters")


class Refused(ValueError):
    """The action was not done; the message says why, for the operator."""


class NotFound(Refused, LookupError):
    pass


class Invalid(Refused):
    """A usage error (e.g. a secret of the wrong form): refused before anything is done, and
    not an action, so no audit entry."""


def _when(t: datetime | float | None) -> str | None:
    if t is None:
        return None
    return t.isoformat() if isinstance(t, datetime) else datetime.fromtimestamp(t, UTC).isoformat()


@asynccontextmanager
async def _audited(
    conn: Tx, actor: Actor, action: str, target: str, params: dict[str, Any]
) -> AsyncIterator[_Outcome]:
    """The action's transaction; its entry is written last, in it. A refusal rolls the action
    back and is then recorded on its own."""
    out = _Outcome()
    try:
        async with conn.transaction():
            yield out
            await audit.record(
                conn, actor=actor.name, via=actor.via, action=action, target=target,
                params=params, rows=out.rows, outcome=out.text,
            )  # fmt: skip
    except (Refused, LookupError, ValueError, outbox.AmbiguousKey) as exc:
        if isinstance(exc, asyncpg.InterfaceError):
            raise  # the driver's (a value it could not send, quoted in its text): not a refusal
        await audit.record(
            conn, actor=actor.name, via=actor.via, action=action, target=target,
            params=params, rows=0, outcome=f"refused: {exc}"[:1000],
        )  # fmt: skip
        raise


@dataclass
class _Outcome:
    rows: int = 0
    text: str = ""


# --- dead items ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DeadReplayed:
    rows: list[int]
    items: list[int]
    missing: list[str] = field(default_factory=list)  # asked for by id, not dead (or unknown)

    def lines(self) -> list[str]:
        out = [f"replayed {len(self.rows)} row(s): {self.rows}" if self.rows else "no row to replay"]
        out.append(
            f"replayed {len(self.items)} event(s): {self.items}" if self.items else "no event to replay"
        )
        if self.missing:
            out.append(f"not dead (or unknown): {', '.join(self.missing)}")
        return out


async def dead_replay(
    conn: Tx,
    actor: Actor,
    *,
    rows: Sequence[int] = (),
    items: Sequence[int] = (),
    every: bool = False,
    since: datetime | None = None,
    until: datetime | None = None,
) -> DeadReplayed:
    """Dead rows (R ids) and dead events (E ids) due again with a fresh budget; ``every``:
    all of them received in [since, until) instead of ids. Safe: an event already processed is
    a duplicate by its key."""
    if every == bool(rows or items):
        raise Refused("give ids, or a range (or everything), not both and not neither")
    target = "every dead item" if every else " ".join([*(f"R{i}" for i in rows), *(f"E{i}" for i in items)])
    params = {"since": _when(since), "until": _when(until), "rows": list(rows), "items": list(items)}
    async with _audited(conn, actor, "dead.replay", target, params) as out:
        got_rows: list[int] = []
        got_items: list[int] = []
        if every or rows:
            got_rows = await inbox.dead_replay(
                conn, ids=None if every else list(rows), since=since, until=until
            )
        if every or items:
            got_items = await dead_events.replay(
                conn, ids=None if every else list(items), since=since, until=until
            )
        if got_rows or got_items:
            await inbox.notify(conn)
        missing = [f"R{i}" for i in sorted(set(rows) - set(got_rows))]
        missing += [f"E{i}" for i in sorted(set(items) - set(got_items))]
        result = DeadReplayed(got_rows, got_items, missing)
        out.rows, out.text = len(got_rows) + len(got_items), "; ".join(result.lines())
    return result


# --- outbox -------------------------------------------------------------------------------


async def release(
    conn: Tx,
    actor: Actor,
    key: str,
    tenant: str | None = None,
    *,
    window_s: float,
    may_duplicate: bool = False,
) -> str:
    """One row (review, unknown or failed) back to pending: the operator decided to send it.
    Refused for a row that reached the provider (it would be sent twice), for an unknown row
    inside its reconcile window (``window_s``: its status may still come) unless the operator
    accepts that it may be sent twice (``may_duplicate``, recorded in the audit entry), and
    while webhooks that may hold its status are unprocessed. The one place that decides what
    "release" may do: the command line and the console both call it."""
    params: dict[str, Any] = {"tenant": tenant}
    if may_duplicate:
        params["may_duplicate"] = True
    async with _audited(conn, actor, "outbox.release", _key(key, tenant), params) as out:
        out.text = await outbox.release(conn, key, tenant, window_s=window_s, may_duplicate=may_duplicate)
        out.rows = 1
    return out.text


async def cancel(conn: Tx, actor: Actor, key: str, tenant: str | None = None) -> str:
    """One row (pending, review, unknown or failed) cancelled: never sent."""
    async with _audited(conn, actor, "outbox.cancel", _key(key, tenant), {"tenant": tenant}) as out:
        out.text = await outbox.cancel(conn, key, tenant)
        out.rows = 1
    return out.text


def _key(key: str, tenant: str | None) -> str:
    return f"{tenant}/{key}" if tenant else key


def bulk_lines(verb: str, done: outbox.Bulk) -> list[str]:
    """What a bulk release or cancel did, for the operator."""
    out = [f"{done.done} row(s) {verb}"]
    if done.refused:
        out.append(
            f"{done.refused} row(s) not released: they have a wamid or a delivery status (the "
            "provider accepted them), or their provider no longer remembers the Idempotency-Key "
            "of an attempt that may have reached it (Tenashi: 24 h); releasing could send them twice"
        )
    if done.waiting:
        out.append(
            f"{done.waiting} row(s) not released yet: webhooks received since they were created "
            "are unprocessed (pending or dead) and may hold their status"
        )
    if done.early and done.early_first and done.early_last:
        first, last = outbox.utc_text(done.early_first), outbox.utc_text(done.early_last)
        out.append(
            f"{done.early} row(s) not released yet: unknown for less than the reconcile window "
            "(GATEWAY_RECONCILE_WINDOW_S), their status may still come and a release now may send "
            f"them twice; they may be released from {first}"
            + (f" (the last from {last})" if last != first else "")
        )
    if done.released_early:
        out.append(
            f"{done.released_early} of them released inside their reconcile window: the operator "
            "accepted that they may be sent twice"
        )
    return out


async def outbox_bulk(
    conn: Tx,
    actor: Actor,
    action: str,
    *,
    state: OutboxState | str,
    since: float | None,
    until: float | None,
    tenant: str | None,
    window_s: float,
    may_duplicate: bool = False,
) -> outbox.Bulk:
    """Release or cancel every row in ``state`` last changed in [since, until) (of ``tenant``),
    with the same refusals as one row (``window_s``, ``may_duplicate``: as for ``release``)."""
    if action not in ("release", "cancel"):
        raise ValueError(f"not a bulk action: {action!r}")
    params: dict[str, Any] = {"state": str(state), "since": _when(since), "until": _when(until)}
    params["tenant"] = tenant
    if may_duplicate and action == "release":
        params["may_duplicate"] = True
    target = f"state={state}" + (f" tenant={tenant}" if tenant else "")
    async with _audited(conn, actor, f"outbox.{action}_bulk", target, params) as out:
        if action == "release":
            done = await outbox.release_bulk(
                conn, state=state, since=since, until=until, tenant=tenant, window_s=window_s,
                may_duplicate=may_duplicate,
            )  # fmt: skip
        else:
            done = await outbox.cancel_bulk(conn, state=state, since=since, until=until, tenant=tenant)
        out.rows = done.done
        out.text = "; ".join(bulk_lines("released" if action == "release" else "cancelled", done))
    return done


# --- destinations and deliveries ----------------------------------------------------------


async def set_enabled(conn: Tx, actor: Actor, name: str, *, enabled: bool) -> str:
    verb = "enabled" if enabled else "disabled"
    action = "destination.enable" if enabled else "destination.disable"
    async with _audited(conn, actor, action, name, {}) as out:
        if not await deliveries.set_enabled(conn, name=name, enabled=enabled):
            raise NotFound(f"no destination named {name!r}")
        out.rows, out.text = 1, f"{verb} {name}"
    return out.text


@dataclass(frozen=True, slots=True)
class Rotated:
    secret: str  # shown once, to be given to the receiver
    previous_until: datetime


async def rotate_secret(
    conn: Tx, actor: Actor, name: str, *, secret: str | None = None, grace_h: float = 24.0
) -> Rotated:
    """Sign with a new secret (given, or generated); the current one stays valid for
    ``grace_h`` hours. The new secret is returned once and never written to the audit log.

    A Meta-format destination's receiver (a bot built on Meta's webhooks) verifies one
    ``X-Hub-Signature-256`` with one app secret, so its secret switches at once: the grace must
    be 0."""
    if not 0 <= grace_h <= MAX_GRACE_H:
        raise Refused(f"the grace period must be 0..{MAX_GRACE_H} hours")
    # What the secret must be depends on the destination's format; a wrong one is a usage error
    # (no audit entry), a missing destination a refusal (recorded below).
    dest = await deliveries.get_destination(conn, name=name)
    fmt = "standard" if dest is None else dest["format"]
    if fmt == "meta" and grace_h:
        raise Invalid(
            "a Meta-format destination is verified with one secret (one X-Hub-Signature-256): "
            "rotate it with --grace-h 0, then give the bot the new secret (what it refuses "
            "meanwhile is retried)"
        )
    new = secret if secret is not None else destinations.new_secret(fmt)
    try:
        destinations.check_secret(fmt, new)
    except ValueError as exc:
        raise Invalid(str(exc)) from None
    params = {"grace_h": grace_h, "generated": secret is None}
    async with _audited(conn, actor, "destination.rotate_secret", name, params) as out:
        until = await deliveries.rotate_secret(conn, name=name, secret=new, grace_s=grace_h * 3600)
        if until is None:
            raise NotFound(f"no destination named {name!r}")
        out.rows = 1
        out.text = f"rotated the secret of {name}: the previous one stays valid until {until.isoformat()}"
    return Rotated(new, until)


async def add_destination(
    conn: Tx,
    actor: Actor,
    *,
    name: str,
    url: str,
    events: Sequence[str],
    secret: str,
    max_in_flight: int,
    ordered: bool,
    numbers: Sequence[str] | None = None,
    tenant: str | None = None,
    format: str = "standard",
) -> str:
    params = {"url": url, "events": list(events), "max_in_flight": max_in_flight, "ordered": ordered}
    if format != "standard":
        params["format"] = format
    if numbers is not None:
        params["numbers"] = list(numbers)
    if tenant is not None:
        params["tenant"] = tenant
    async with _audited(conn, actor, "destination.add", name, params) as out:
        try:
            await deliveries.add_destination(
                conn, name=name, url=url, events=events, secret=secret,
                max_in_flight=max_in_flight, ordered=ordered, numbers=numbers, tenant=tenant,
                format=format,
            )  # fmt: skip
        except deliveries.DestinationExists:
            raise Refused(f"destination {name!r} exists (remove it first)") from None
        out.rows, out.text = 1, f"added {name} -> {url} events={','.join(events)}" + (
            f" format={format}" if format != "standard" else ""
        )
    return out.text


async def remove_destination(conn: Tx, actor: Actor, name: str) -> int:
    """Delete it and its deliveries; how many deliveries went with it."""
    async with _audited(conn, actor, "destination.remove", name, {}) as out:
        n = await deliveries.remove_destination(conn, name=name)
        if n is None:
            raise NotFound(f"no destination named {name!r}")
        out.rows, out.text = n, f"removed {name} and its {n} deliveries"
    return n


async def replay_deliveries(
    conn: Tx,
    actor: Actor,
    *,
    destination: str | None,
    since: datetime | None,
    until: datetime | None,
    state: str = "failed",
) -> int:
    """Finished deliveries (failed, or delivered) received in [since, until) sent again, with
    their webhook-id unchanged so a receiver can tell."""
    if state not in ("failed", "delivered"):
        raise Refused(f"only failed or delivered deliveries are replayed, not {state!r}")
    params = {"destination": destination, "since": _when(since), "until": _when(until), "state": state}
    target = destination or "every destination"
    async with _audited(conn, actor, "deliveries.replay", target, params) as out:
        n, expired = await deliveries.replay(
            conn, destination=destination, since=since, until=until, state=state
        )
        out.rows, out.text = n, f"replayed {n} {state} deliveries" if n else "nothing to replay"
        if expired:
            out.text += f"; {expired} not: their events' bodies are past retention"
    return n


async def backfill_deliveries(
    conn: Tx, actor: Actor, *, destination: str, since: datetime, until: datetime
) -> Backfilled:
    params = {"since": _when(since), "until": _when(until)}
    async with _audited(conn, actor, "deliveries.backfill", destination, params) as out:
        b = await backfill(conn, destination=destination, since=since, until=until)
        out.rows = b.inserted
        out.text = f"backfilled {b.inserted} deliveries from {b.seen} events"
    return b


# --- senders ------------------------------------------------------------------------------


async def resume_breaker(conn: Tx, actor: Actor, scope: str, key: str, *, provider: str = "meta") -> str:
    """Close a sender's breaker by hand: the rows it held are due now."""
    b = BreakerId(scope, provider, key)
    target = f"{scope}/{provider}/{key}"
    async with _audited(conn, actor, "senders.resume", target, {}) as out:
        if not await pacing.resume(conn, b, now=time.time()):
            raise Refused(f"breaker {target} is not open")
        out.rows, out.text = 1, f"breaker {target} closed; its rows are due now"
    return out.text
