"""Operator commands: dead letters, outbox rows, sender breakers."""

from __future__ import annotations

import argparse
import logging
import sys
from datetime import UTC, datetime

import asyncpg

from gateway.cli.common import actor, actor_args, dead_id, epoch, one_line, when
from gateway.core.enums import OutboxState
from gateway.core.settings import Settings
from gateway.operator import actions
from gateway.runtime.database import with_connection
from gateway.store import dead_events, inbox, lanes, outbox, pacing

log = logging.getLogger("gateway")


def dead_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=("list", "show", "replay"))
    p.add_argument(
        "ids", nargs="*", type=dead_id, metavar="ID", help="R<row> or E<event> (a bare number: row)"
    )
    p.add_argument("--all", action="store_true", help="replay everything dead (within --since/--until)")
    p.add_argument("--since", type=when, default=None, help="received at or after (ISO 8601, or 2h ago)")
    p.add_argument("--until", type=when, default=None, help="received before (ISO 8601, or 30m ago)")
    p.add_argument("--retrying", action="store_true", help="list: also events waiting for a retry")
    p.add_argument("--limit", type=int, default=100, help="entries to list (default 100)")
    p.add_argument("--raw", action="store_true", help="show: only the raw bytes, nothing else")
    actor_args(p)


def cmd_dead(settings: Settings, ns: argparse.Namespace) -> int:
    """Dead letters: whole rows (a body that is not JSON) and single events (``dead_events``),
    with their raw bytes. Replaying is safe: an event already processed is a duplicate by its
    key and does nothing."""
    ranged = ns.since is not None or ns.until is not None
    if ns.action == "replay" and not ns.ids and not ns.all and not ranged:
        print("gateway dead replay: give ids, --all, or --since/--until", file=sys.stderr)
        return 2
    if ns.action == "replay" and ns.ids and (ns.all or ranged):
        print("gateway dead replay: give ids or a range/--all, not both", file=sys.stderr)
        return 2
    if ns.action == "show" and len(ns.ids) != 1:
        print("gateway dead show: give one id (R<row> or E<event>)", file=sys.stderr)
        return 2

    async def work(conn: asyncpg.Connection) -> int:
        if ns.action == "list":
            return await _dead_list(conn, ns)
        if ns.action == "show":
            return await _dead_show(conn, *ns.ids[0], raw=ns.raw)
        return await _dead_replay(conn, ns)

    return with_connection(settings, work)


async def _dead_list(conn: asyncpg.Connection, ns: argparse.Namespace) -> int:
    since, until = ns.since, ns.until
    rows = await inbox.dead_list(conn, limit=ns.limit, since=since, until=until)
    states = [dead_events.DEAD, dead_events.RETRY] if ns.retrying else [dead_events.DEAD]
    items = await dead_events.list_items(conn, states=states, limit=ns.limit, since=since, until=until)
    for r in rows:
        print(
            f"R{r.id:<9} row   {r.source:8} {r.received_at:%Y-%m-%dT%H:%M:%S%z} "
            f"attempts={r.attempts} bytes={r.bytes} {one_line(r.last_error)}"
        )
    for i in items:
        retry = f" next={i.next_attempt_at:%H:%M:%S}" if i.state == dead_events.RETRY else ""
        print(
            f"E{i.id:<9} {i.state:5} {i.source:8} {i.received_at:%Y-%m-%dT%H:%M:%S%z} "
            f"row=R{i.inbox_id} {i.path} key={i.event_key or '-'} attempts={i.attempts}"
            f" deferrals={i.deferrals}{retry} bytes={i.bytes} {one_line(i.last_error)}"
        )
    n_rows = await inbox.dead_count(conn, since=since, until=until)
    n_items = await dead_events.count(conn, states=states, since=since, until=until)
    shown = "" if (n_rows, n_items) == (len(rows), len(items)) else f" ({len(rows) + len(items)} shown)"
    print(f"{n_rows} dead row(s), {n_items} {'/'.join(states)} event(s){shown}")
    return 0


async def _dead_show(conn: asyncpg.Connection, kind: str, ident: int, *, raw: bool) -> int:
    if kind == "R":
        r = await inbox.get(conn, inbox_id=ident)
        fields: tuple[str, ...] = ("id", "source", "state", "received_at", "delivery_id", "attempts")
        fields += ("processed_at",)
        data = None if r is None else bytes(r["body"])
    else:
        r = await dead_events.get(conn, item_id=ident)
        fields = ("id", "inbox_id", "path", "event_key", "kind", "source", "unit", "state", "attempts")
        fields += ("deferrals", "received_at", "created_at", "next_attempt_at", "updated_at", "context")
        data = None if r is None else bytes(r["fragment"])
    if r is None or data is None:
        print(f"gateway: no {'row' if kind == 'R' else 'dead event'} {kind}{ident}", file=sys.stderr)
        return 1
    if not raw:
        for f in fields:
            print(f"{f}: {r[f]}")
        print(f"error: {r['last_error'] or '-'}")
        print(f"bytes ({len(data)}):")
        sys.stdout.flush()
    sys.stdout.buffer.write(data)
    if not raw:
        sys.stdout.buffer.write(b"\n")
    sys.stdout.buffer.flush()
    return 0


async def _dead_replay(conn: asyncpg.Connection, ns: argparse.Namespace) -> int:
    done = await actions.dead_replay(
        conn,
        actor(ns),
        rows=[i for k, i in ns.ids if k == "R"],
        items=[i for k, i in ns.ids if k == "E"],
        every=not ns.ids,
        since=ns.since,
        until=ns.until,
    )
    for line in done.lines():
        print(line)
    return 0 if not done.missing else 1


MAY_DUPLICATE = "--i-know-it-may-duplicate"


def outbox_args(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", required=True)
    ls = sub.add_parser("list", help="list outbox rows in a state")
    ls.add_argument("--state", default="review", choices=[s.value for s in OutboxState])
    ls.add_argument("--limit", type=int, default=100)
    actions = (
        ("release", "send a review/unknown/failed row (again); never one that reached the provider"),
        ("cancel", "never send it"),
    )
    for name, help_text in actions:
        a = sub.add_parser(name, help=help_text, description=help_text)
        a.add_argument("key", nargs="?", help="one row's key; or select rows in bulk with --state")
        a.add_argument("--tenant", default=None, help="the key's tenant, or the tenant of the bulk selection")
        a.add_argument(
            "--state", default=None, choices=[s.value for s in OutboxState], help="bulk: rows in this state"
        )
        a.add_argument("--since", type=epoch, default=None, help="bulk: last changed at or after (ISO-8601)")
        a.add_argument("--until", type=epoch, default=None, help="bulk: last changed before (ISO-8601)")
        if name == "release":
            a.add_argument(
                MAY_DUPLICATE,
                action="store_true",
                dest="may_duplicate",
                help="release an unknown row inside its reconcile window (GATEWAY_RECONCILE_WINDOW_S) "
                "anyway: its status may still come, and the customer may get it twice (the audit log "
                "records that you said so)",
            )
        actor_args(a)


def cmd_outbox(settings: Settings, ns: argparse.Namespace) -> int:
    bulk = ns.action != "list" and ns.state is not None
    if ns.action != "list" and bulk == (ns.key is not None):
        print(f"gateway outbox {ns.action}: give a KEY or --state (bulk), not both", file=sys.stderr)
        return 2
    if ns.action != "list" and not bulk and (ns.since is not None or ns.until is not None):
        print(
            f"gateway outbox {ns.action}: --since/--until select rows in bulk: add --state", file=sys.stderr
        )
        return 2

    async def work(conn: asyncpg.Connection) -> int:
        if ns.action == "list":
            rows = await outbox.list_state(conn, state=ns.state, limit=ns.limit)
            print("tenant\tkey\tstate\trecipient\tattempts\tcode\terror\tupdated_at")
            for r in rows:
                cols = [r["tenant"], r["idem_key"], r["state"], r["recipient"], r["attempts"]]
                cols += [r["last_error_code"] or "", r["last_error"] or "", r["updated_at"].isoformat()]
                print("\t".join(str(c) for c in cols))
            return 0
        who = actor(ns)
        window_s, may_duplicate = settings.reconcile_window_s, getattr(ns, "may_duplicate", False)
        if bulk:
            try:
                done = await actions.outbox_bulk(
                    conn, who, ns.action, state=ns.state, since=ns.since, until=ns.until, tenant=ns.tenant,
                    window_s=window_s, may_duplicate=may_duplicate,
                )  # fmt: skip
            except ValueError as exc:
                print(f"gateway: {exc}", file=sys.stderr)
                return 1
            for line in actions.bulk_lines("released" if ns.action == "release" else "cancelled", done):
                print(line)
            if done.early:
                print(f"to release them now anyway: add {MAY_DUPLICATE}")
            return 0
        try:
            if ns.action == "release":
                line = await actions.release(
                    conn, who, ns.key, ns.tenant, window_s=window_s, may_duplicate=may_duplicate
                )
            else:
                line = await actions.cancel(conn, who, ns.key, ns.tenant)
            print(line)
        except outbox.TooEarly as exc:
            print(f"gateway: {exc}; to release it now anyway: add {MAY_DUPLICATE}", file=sys.stderr)
            return 1
        except outbox.AmbiguousKey as exc:
            print(f"gateway: key {ns.key!r} is used by tenants {exc}: pass --tenant", file=sys.stderr)
            return 2
        except (LookupError, ValueError) as exc:
            print(f"gateway: {exc}", file=sys.stderr)
            return 1
        return 0

    return with_connection(settings, work)


def senders_args(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", required=True)
    sub.add_parser("list", help="every circuit breaker (per sending number and per access token)")
    r = sub.add_parser("resume", help="close a breaker by hand: its rows are due now")
    r.add_argument("scope", choices=("number", "token"))
    r.add_argument(
        "key",
        help="the phone_number_id (number); for a token: 'default', or the first number "
        "GATEWAY_GRAPH_TOKENS lists with that token",
    )
    r.add_argument("--provider", default="meta", choices=("meta", "tenashi"))
    actor_args(r)


def cmd_senders(settings: Settings, ns: argparse.Namespace) -> int:
    async def work(conn: asyncpg.Connection) -> int:
        if ns.action == "list":
            rows = await pacing.list_breakers(conn)
            print("scope\tprovider\tkey\tstate\tfailures\tcode\tprobe_at\topened_at\terror")
            for b in rows:
                probe_at = (
                    "" if b["retry_at"] is None else datetime.fromtimestamp(b["retry_at"], UTC).isoformat()
                )
                opened = b["opened_at"].isoformat() if b["opened_at"] else ""
                cols = [b["scope"], b["provider"], b["key"], b["state"], b["failures"], b["code"] or ""]
                cols += [probe_at, opened, one_line(b["error"])]
                print("\t".join(str(c) for c in cols))
            return 0
        try:
            print(await actions.resume_breaker(conn, actor(ns), ns.scope, ns.key, provider=ns.provider))
        except actions.Refused as exc:
            print(f"gateway: {exc}", file=sys.stderr)
            return 1
        return 0

    return with_connection(settings, work)


def cmd_lanes(settings: Settings, ns: argparse.Namespace) -> int:
    async def work(conn: asyncpg.Connection) -> int:
        rows = await lanes.state(conn)
        print("lane\tshard\towner\tlease_until\tmoves\tmoved_at\tdone\twindow")
        for r in rows:
            lease = r["lease_until"].isoformat() if r["lease_until"] else ""
            cols = [r["lane"], r["shard"], r["owner"] or "-", lease, r["version"]]
            cols += [r["advanced_at"].isoformat(), r["done"], r["win"] or ""]
            print("\t".join(str(c) for c in cols))
        owned = [r["owner"] for r in rows if r["owner"]]
        print(f"{len(rows)} lanes, {len(owned)} owned by {len(set(owned))} consumer process(es)")
        return 0

    return with_connection(settings, work)
