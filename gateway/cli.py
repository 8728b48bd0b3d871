"""``gateway`` command line: every command, thin. Nothing imports this module."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import asyncpg

from gateway import __version__, runtime, tracing
from gateway.core import forwarding, stdwebhooks
from gateway.core.enums import OutboxState
from gateway.core.settings import Settings, SettingsError, env_names, unknown_variables
from gateway.runtime.startup import EXIT_STARTUP, StartupError
from gateway.store import dead_events, deliveries, inbox, outbox, pacing
from gateway.store.db import migrate

log = logging.getLogger("gateway")

Command = Callable[[Settings, argparse.Namespace], int]


def _serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        metavar="N",
        help="processes sharing the port (SO_REUSEPORT); default GATEWAY_WORKERS, 0: one per core",
    )
    # Internal: a worker started by the parent of `serve --workers N`.
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)


def cmd_serve(settings: Settings, ns: argparse.Namespace) -> int:
    from gateway.runtime import workers
    from gateway.web.app import build_app

    if ns.worker:
        workers.die_with_parent()
    if ns.workers is not None and ns.workers < 0:
        print("gateway serve: --workers must be >= 0", file=sys.stderr)
        return 2
    n = 1 if ns.worker else workers.count(settings, ns.workers)
    if n > 1 and settings.port == 0:
        print("gateway serve: several workers need a fixed GATEWAY_PORT, not 0", file=sys.stderr)
        return 2
    settings, server = runtime.resolve_database(settings)
    if n > 1:
        log.info("settings: %s", settings.redacted())
        return runtime.serve_workers(settings, n, embedded=server)
    runtime.install_uvloop()
    asyncio.run(runtime.wait_for(settings))
    app = build_app(settings)
    if not ns.worker:
        log.info("settings: %s", settings.redacted())
    runtime.tune_gc()
    return runtime.serve_http(app, settings, embedded=server, reuse_port=ns.worker)


def cmd_migrate(settings: Settings, ns: argparse.Namespace) -> int:
    async def work(conn: asyncpg.Connection) -> int:
        applied = await migrate(conn)
        print(f"applied {len(applied)} migration(s): {applied}" if applied else "schema up to date")
        return 0

    return runtime.with_connection(settings, work)


def cmd_settings(settings: Settings, ns: argparse.Namespace) -> int:
    rows = env_names()
    width = max(len(name) for name, _, _ in rows)
    print(f"{'variable':{width}}  {'default':24}  what it does")
    for name, default, doc in rows:
        if len(default) > 24:  # a long default (a URL) gets its own line
            print(f"{name:{width}}  {default}\n{'':{width}}  {'':24}  {doc}")
        else:
            print(f"{name:{width}}  {default:24}  {doc}")
    return 0


def cmd_consume(settings: Settings, ns: argparse.Namespace) -> int:
    from gateway.inbound.consumer_group import ConsumerGroup

    async def work(pool: asyncpg.Pool, stop: asyncio.Event) -> None:
        group = ConsumerGroup(pool, settings)
        try:
            await group.start()
            log.info("%d consumer(s) running", settings.consumer_concurrency)
            await stop.wait()
        finally:
            await group.stop()

    return runtime.run_worker(settings, (1, settings.consumer_concurrency + 3), work, inbound=True)


def cmd_send(settings: Settings, ns: argparse.Namespace) -> int:
    from gateway.outbound.sender import Sender

    async def work(pool: asyncpg.Pool, stop: asyncio.Event) -> None:
        sender = Sender(pool, settings)
        log.info("sender running: %s", settings.redacted())
        try:
            await sender.run(stop)
        finally:
            await sender.close()

    return runtime.run_worker(settings, (settings.db_pool_min, settings.db_pool_max), work, outbound=True)


def _one_line(text: str | None, width: int = 100) -> str:
    return " ".join((text or "").split())[:width]


def _when(raw: str) -> datetime:
    """ISO 8601 (a time without an offset is UTC), or an age: 30m, 2h, 7d."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    if raw[-1:] in units and raw[:-1].replace(".", "", 1).isdigit():
        return datetime.now(UTC) - timedelta(seconds=float(raw[:-1]) * units[raw[-1]])
    try:
        value = datetime.fromisoformat(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a time: {raw!r} (ISO 8601, or 30m / 2h / 7d ago)") from None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def _dead_id(raw: str) -> tuple[str, int]:
    """``R12`` (or ``12``) a whole inbox row, ``E7`` one dead event."""
    kind, digits = (raw[0].upper(), raw[1:]) if raw[:1].isalpha() else ("R", raw)
    if kind not in ("R", "E") or not digits.isdigit():
        raise argparse.ArgumentTypeError(f"not a dead id: {raw!r} (R<row id> or E<event id>)")
    return kind, int(digits)


def _dead_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=("list", "show", "replay"))
    p.add_argument(
        "ids", nargs="*", type=_dead_id, metavar="ID", help="R<row> or E<event> (a bare number: row)"
    )
    p.add_argument("--all", action="store_true", help="replay everything dead (within --since/--until)")
    p.add_argument("--since", type=_when, default=None, help="received at or after (ISO 8601, or 2h ago)")
    p.add_argument("--until", type=_when, default=None, help="received before (ISO 8601, or 30m ago)")
    p.add_argument("--retrying", action="store_true", help="list: also events waiting for a retry")
    p.add_argument("--limit", type=int, default=100, help="entries to list (default 100)")
    p.add_argument("--raw", action="store_true", help="show: only the raw bytes, nothing else")


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

    return runtime.with_connection(settings, work)


def _epoch(raw: str) -> float:
    """An ISO 8601 time (UTC when no offset is given) as epoch seconds."""
    return _when(raw).timestamp()


async def _dead_list(conn: asyncpg.Connection, ns: argparse.Namespace) -> int:
    since, until = ns.since, ns.until
    rows = await inbox.dead_list(conn, limit=ns.limit, since=since, until=until)
    states = [dead_events.DEAD, dead_events.RETRY] if ns.retrying else [dead_events.DEAD]
    items = await dead_events.list_items(conn, states=states, limit=ns.limit, since=since, until=until)
    for r in rows:
        print(
            f"R{r.id:<9} row   {r.source:8} {r.received_at:%Y-%m-%dT%H:%M:%S%z} "
            f"attempts={r.attempts} bytes={r.bytes} {_one_line(r.last_error)}"
        )
    for i in items:
        retry = f" next={i.next_attempt_at:%H:%M:%S}" if i.state == dead_events.RETRY else ""
        print(
            f"E{i.id:<9} {i.state:5} {i.source:8} {i.received_at:%Y-%m-%dT%H:%M:%S%z} "
            f"row=R{i.inbox_id} {i.path} key={i.event_key or '-'} attempts={i.attempts}"
            f" deferrals={i.deferrals}{retry} bytes={i.bytes} {_one_line(i.last_error)}"
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
    row_ids = [i for k, i in ns.ids if k == "R"]
    item_ids = [i for k, i in ns.ids if k == "E"]
    every = not ns.ids
    async with conn.transaction():
        rows: list[int] = []
        items: list[int] = []
        if every or row_ids:
            rows = await inbox.dead_replay(
                conn, ids=None if every else row_ids, since=ns.since, until=ns.until
            )
        if every or item_ids:
            items = await dead_events.replay(
                conn, ids=None if every else item_ids, since=ns.since, until=ns.until
            )
        if rows or items:
            await inbox.notify(conn)
    print(f"replayed {len(rows)} row(s): {rows}" if rows else "no row to replay")
    print(f"replayed {len(items)} event(s): {items}" if items else "no event to replay")
    missing = [f"R{i}" for i in sorted(set(row_ids) - set(rows))]
    missing += [f"E{i}" for i in sorted(set(item_ids) - set(items))]
    if missing:
        print(f"not dead (or unknown): {', '.join(missing)}")
    return 0 if not missing else 1


def _outbox_args(p: argparse.ArgumentParser) -> None:
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
        a.add_argument("--since", type=_epoch, default=None, help="bulk: last changed at or after (ISO-8601)")
        a.add_argument("--until", type=_epoch, default=None, help="bulk: last changed before (ISO-8601)")


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
        if bulk:
            many = outbox.release_bulk if ns.action == "release" else outbox.cancel_bulk
            try:
                done = await many(conn, state=ns.state, since=ns.since, until=ns.until, tenant=ns.tenant)
            except ValueError as exc:
                print(f"gateway: {exc}", file=sys.stderr)
                return 1
            verb = "released" if ns.action == "release" else "cancelled"
            print(f"{done.done} row(s) {verb}")
            if done.refused:
                print(
                    f"{done.refused} row(s) not released: they have a wamid or a delivery status "
                    "(the provider accepted them; releasing would send them twice)"
                )
            if done.waiting:
                print(
                    f"{done.waiting} row(s) not released yet: webhooks received since they were created "
                    "are unprocessed (pending or dead) and may hold their status"
                )
            return 0
        fn = outbox.release if ns.action == "release" else outbox.cancel
        try:
            print(await fn(conn, ns.key, ns.tenant))
        except outbox.AmbiguousKey as exc:
            print(f"gateway: key {ns.key!r} is used by tenants {exc}: pass --tenant", file=sys.stderr)
            return 2
        except (LookupError, ValueError) as exc:
            print(f"gateway: {exc}", file=sys.stderr)
            return 1
        return 0

    return runtime.with_connection(settings, work)


def cmd_forward(settings: Settings, ns: argparse.Namespace) -> int:
    from gateway.outbound.forwarder import Forwarder

    async def work(pool: asyncpg.Pool, stop: asyncio.Event) -> None:
        forwarder = Forwarder(pool, settings)
        log.info("forwarder running: %d requests in flight at most", settings.forward_concurrency)
        try:
            await forwarder.run(stop)
        finally:
            await forwarder.close()

    return runtime.run_worker(settings, (1, 4), work, forward=True)


def _destinations_args(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", required=True)
    add = sub.add_parser("add", help="add a destination (takes effect without a restart)")
    add.add_argument("name")
    add.add_argument("url")
    add.add_argument("--events", required=True, help="comma-separated: message,status,account")
    add.add_argument(
        "--secret", help="whsec_<base64 of 24..64 bytes>; omitted: one is generated and printed once"
    )
    add.add_argument("--max-in-flight", type=int, default=16, help="requests in flight at once (default 16)")
    add.add_argument("--ordered", action="store_true", help="one delivery in flight per customer wa_id")
    sub.add_parser("list", help="destinations, breaker state, backlog")
    for name, help_text in (
        ("disable", "stop forwarding to it (new events are not queued for it meanwhile)"),
        ("enable", "resume forwarding to it"),
        ("remove", "delete it and its deliveries"),
    ):
        sub.add_parser(name, help=help_text).add_argument("name")


def cmd_destinations(settings: Settings, ns: argparse.Namespace) -> int:
    secret: str | None = None
    if ns.action == "add":
        try:
            forwarding.check_name(ns.name)
            forwarding.check_url(ns.url)
            events = forwarding.parse_events(ns.events)
            if not 1 <= ns.max_in_flight <= 10000:
                raise ValueError("--max-in-flight must be 1..10000")
            secret = ns.secret if ns.secret is not None else stdwebhooks.generate_secret()
            stdwebhooks.secret_key(secret)
        except ValueError as exc:
            print(f"gateway destinations add: {exc}", file=sys.stderr)
            return 2

    async def work(conn: asyncpg.Connection) -> int:
        if ns.action == "add":
            assert secret is not None
            try:
                await deliveries.add_destination(
                    conn, name=ns.name, url=ns.url, events=events, secret=secret,
                    max_in_flight=ns.max_in_flight, ordered=ns.ordered,
                )  # fmt: skip
            except deliveries.DestinationExists:
                print(f"gateway: destination {ns.name!r} exists (remove it first)", file=sys.stderr)
                return 1
            print(f"added {ns.name} -> {ns.url} events={','.join(events)}")
            if ns.secret is None:
                # The only time the generated secret is shown: the receiver needs it to verify.
                print(f"secret (shown once, give it to the receiver): {secret}")
            return 0
        if ns.action == "list":
            print(
                "name\tenabled\tevents\tordered\tmax_in_flight\tbreaker\tfailures\tbacklog\tfailed\tsecret\turl"
            )
            for d in await deliveries.list_destinations(conn):
                cols = [d.name, d.enabled, ",".join(d.events), d.ordered, d.max_in_flight, d.breaker_state]
                cols += [
                    d.consecutive_failures,
                    d.backlog,
                    d.failed,
                    stdwebhooks.mask_secret(d.secret),
                    d.url,
                ]
                print("\t".join(str(c) for c in cols))
            return 0
        if ns.action == "remove":
            n = await deliveries.remove_destination(conn, name=ns.name)
            if n is None:
                print(f"gateway: no destination named {ns.name!r}", file=sys.stderr)
                return 1
            print(f"removed {ns.name} and its {n} deliveries")
            return 0
        if not await deliveries.set_enabled(conn, name=ns.name, enabled=ns.action == "enable"):
            print(f"gateway: no destination named {ns.name!r}", file=sys.stderr)
            return 1
        print(f"{ns.action}d {ns.name}")
        return 0

    return runtime.with_connection(settings, work)


def _deliveries_args(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", required=True)
    states = [s.value for s in forwarding.DeliveryState]
    for name, help_text in (
        ("list", "deliveries by destination, receipt time range and state"),
        ("replay", "send finished deliveries again (same webhook-id)"),
        ("backfill", "create deliveries for a destination from events already processed"),
    ):
        a = sub.add_parser(name, help=help_text)
        a.add_argument("--destination", required=name == "backfill")
        a.add_argument("--since", type=_when, required=name == "backfill", help="ISO 8601, inclusive")
        a.add_argument("--until", type=_when, required=name == "backfill", help="ISO 8601, exclusive")
        if name == "list":
            a.add_argument("--state", choices=states)
            a.add_argument("--limit", type=int, default=100)
        elif name == "replay":
            a.add_argument("--state", choices=("failed", "delivered"), default="failed")


def cmd_deliveries(settings: Settings, ns: argparse.Namespace) -> int:
    async def work(conn: asyncpg.Connection) -> int:
        if ns.action == "list":
            rows = await deliveries.list_deliveries(
                conn,
                destination=ns.destination,
                since=ns.since,
                until=ns.until,
                state=ns.state,
                limit=ns.limit,
            )
            print(
                "id\tdestination\twebhook_id\tevent_key\tstate\tattempts\treceived_at\tlast_status\tlast_error"
            )
            for r in rows:
                cols = [r.id, r.destination, r.webhook_id, r.event_key, r.state, r.attempts]
                cols += [r.received_at.isoformat(), r.last_status or "", _one_line(r.last_error)]
                print("\t".join(str(c) for c in cols))
            counts = await deliveries.count_deliveries(
                conn, destination=ns.destination, since=ns.since, until=ns.until
            )
            print("totals: " + (", ".join(f"{k}={v}" for k, v in sorted(counts.items())) or "none"))
            return 0
        if ns.action == "replay":
            n = await deliveries.replay(
                conn, destination=ns.destination, since=ns.since, until=ns.until, state=ns.state
            )
            print(f"replayed {n} {ns.state} deliveries" if n else "nothing to replay")
            return 0
        from gateway.outbound.backfill import backfill

        try:
            b = await backfill(conn, destination=ns.destination, since=ns.since, until=ns.until)
        except LookupError as exc:
            print(f"gateway: {exc}", file=sys.stderr)
            return 1
        print(
            f"backfilled {b.inserted} deliveries from {b.seen} events ({b.seen - b.inserted} already there)"
        )
        if b.skipped_no_key:
            print(f"{b.skipped_no_key} Tenashi messages skipped: their event key was purged")
        return 0

    return runtime.with_connection(settings, work)


def _senders_args(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", required=True)
    sub.add_parser("list", help="every circuit breaker (per sending number and per tenant token)")
    r = sub.add_parser("resume", help="close a breaker by hand: its rows are due now")
    r.add_argument("scope", choices=("number", "token"))
    r.add_argument("key", help="the phone_number_id (number) or the tenant (token)")
    r.add_argument("--provider", default="meta", choices=("meta", "tenashi"))


def cmd_senders(settings: Settings, ns: argparse.Namespace) -> int:
    from gateway.core.pacing import BreakerId

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
                cols += [probe_at, opened, _one_line(b["error"])]
                print("\t".join(str(c) for c in cols))
            return 0
        b_id = BreakerId(ns.scope, ns.provider, ns.key)
        if await pacing.resume(conn, b_id, now=time.time()):
            print(f"breaker {ns.scope}/{ns.provider}/{ns.key} closed; its rows are due now")
            return 0
        print(f"gateway: breaker {ns.scope}/{ns.provider}/{ns.key} is not open", file=sys.stderr)
        return 1

    return runtime.with_connection(settings, work)


def cmd_fake_provider(settings: Settings, ns: argparse.Namespace) -> int:
    # A test tool: imported only when asked for, never by the product.
    from gateway.testing import fake_provider

    try:
        fs = fake_provider.settings_from(settings, os.environ)
    except ValueError as exc:
        print(f"gateway: invalid configuration: {exc}", file=sys.stderr)
        return 2
    return runtime.run(fake_provider.serve(fs))


# name -> (help, function, extra arguments)
COMMANDS: dict[str, tuple[str, Command, Callable[[argparse.ArgumentParser], None] | None]] = {
    "serve": ("run the HTTP gateway (with consumers and sender unless disabled)", cmd_serve, _serve_args),
    "migrate": ("apply pending database migrations and exit", cmd_migrate, None),
    "consume": ("run the consumers alone (no HTTP), until SIGTERM or SIGINT", cmd_consume, None),
    "send": ("run the sender (outbox → provider) and reconciler alone", cmd_send, None),
    "dead": (
        "dead rows and events: `dead list`, `dead show ID`, `dead replay ID...|--all|--since T --until T`",
        cmd_dead,
        _dead_args,
    ),
    "outbox": ("list, release or cancel outbox rows (one by key, or in bulk)", cmd_outbox, _outbox_args),
    "senders": (
        "circuit breakers: `senders list`, `senders resume number|token KEY`",
        cmd_senders,
        _senders_args,
    ),
    "forward": ("run the forwarder (deliveries → downstream destinations) alone", cmd_forward, None),
    "destinations": (
        "downstream destinations: add NAME URL --events … | list | disable | enable | remove NAME",
        cmd_destinations,
        _destinations_args,
    ),
    "deliveries": (
        "deliveries to destinations: list | replay | backfill (--destination --since --until)",
        cmd_deliveries,
        _deliveries_args,
    ),
    "fake-provider": (
        "serve the fake Graph API / Tenashi API on GATEWAY_FAKE_HOST:GATEWAY_FAKE_PORT",
        cmd_fake_provider,
        None,
    ),
    "settings": ("print every variable with its default and what it does", cmd_settings, None),
}


# What `gateway COMMAND --help` says: what the command does, what it needs, how it ends.
HELP: dict[str, str] = {
    "serve": """Run the HTTP gateway: Meta's and Tenashi's webhooks (answered 200 only after the raw body
is committed), the send API (/v1/messages), /healthz, /readyz and /metrics. Unless switched off
(GATEWAY_RUN_CONSUMERS, GATEWAY_RUN_SENDER, GATEWAY_RUN_FORWARDER = false) the consumers, the
sender and the forwarder run in the same process.

Listens on GATEWAY_HOST:GATEWAY_PORT (127.0.0.1:8080). Without DATABASE_URL it starts an
embedded PostgreSQL under GATEWAY_DATA_DIR (./var). Migrations run at start-up unless
GATEWAY_MIGRATE_ON_START=false. Stops cleanly on SIGTERM/SIGINT (pending webhooks are committed
first). Exit codes: 2 invalid settings, 3 cannot start (database unreachable, port busy).

--workers N (GATEWAY_WORKERS; default 0 = one per core) runs N such processes on the one port
(SO_REUSEPORT), supervised by a parent that starts the database and migrates once, restarts a
worker that dies and forwards SIGTERM; /metrics on any of them reports all (docs/scaling.md).

Examples:
  GATEWAY_META_APP_SECRETS=<app secret> GATEWAY_META_VERIFY_TOKEN=<token> gateway serve
  GATEWAY_WORKERS=4 gateway serve          # or: gateway serve --workers 4""",
    "migrate": """Apply the pending database migrations and exit (0). Safe to run from several places at
once: migrations are serialised by an advisory lock. Compose runs it once before the other
services; with GATEWAY_MIGRATE_ON_START=false the other commands do not migrate themselves.""",
    "consume": """Run the consumers alone, without HTTP: they claim staged webhooks, record each event exactly
once (a redelivery is a duplicate by its key) and park what keeps failing as dead. Any number of
consume processes may share a database. GATEWAY_CONSUMER_CONCURRENCY loops per process.

With GATEWAY_METRICS_PORT set, serves /metrics and /healthz there. Runs until SIGTERM/SIGINT.""",
    "send": """Run the sender and the reconciler alone: sends outbox rows to the Graph API (or Tenashi) at
most once, paced per recipient and per number, and settles sends whose fate is unknown
(GATEWAY_RECONCILE_WINDOW_S). Any number of send processes may share a database.

With GATEWAY_METRICS_PORT set, serves /metrics and /healthz there. Runs until SIGTERM/SIGINT.""",
    "dead": """Dead letters: whole staged webhooks that are not JSON (R<id>), and single events that
failed on their own (E<id>: a malformed fragment at once, or after GATEWAY_MAX_ATTEMPTS failures
that were the event's fault) while the rest of their POST was processed. Their raw bytes stay
in the database; `show` prints them. Replaying is safe (an event already processed is a
duplicate by its key and does nothing). Times: ISO 8601 (UTC unless an offset is given) or an
age (30m, 2h, 7d).

Examples:
  gateway dead list --since 2h --retrying
  gateway dead show E12
  gateway dead show E12 --raw > fragment.json
  gateway dead replay R1041 E12
  gateway dead replay --since 2026-11-30T08:00 --until 2026-11-30T09:00
  gateway dead replay --all""",
    "outbox": """Outbox rows an operator decides on: sends parked for review (their fate stayed unknown and
their policy is review), failed or unknown ones.

Examples:
  gateway outbox list --state review
  gateway outbox release order-7781        # send it (again)
  gateway outbox cancel order-7781 --tenant acme""",
    "senders": """Circuit breakers of the sender, per sending number and per tenant token. An account-level
error from the provider (e.g. a number blocked or a token expired) opens one: its rows stay
pending, a single probe is sent after a doubling wait (GATEWAY_BREAKER_BACKOFF_S), and a
successful probe closes it. Resume by hand once the cause is fixed.

Examples:
  gateway senders list
  gateway senders resume number 1111
  gateway senders resume token acme --provider tenashi""",
    "forward": """Run the forwarder alone: delivers processed events to the downstream destinations
(`gateway destinations`), signed, retried with backoff for GATEWAY_FORWARD_RETRY_H, a breaker per
destination. With GATEWAY_METRICS_PORT set, serves /metrics and /healthz there. Runs until
SIGTERM/SIGINT.""",
    "destinations": """Downstream destinations that receive processed events, changed live (no restart).

Examples:
  gateway destinations add crm https://crm.example/hooks --events message,status
  gateway destinations list
  gateway destinations disable crm""",
    "deliveries": """Deliveries to destinations: list them, send failed ones again, or create them from events
processed before the destination existed.

Examples:
  gateway deliveries list --destination crm --state failed
  gateway deliveries replay --destination crm --since 2026-11-30T00:00
  gateway deliveries backfill --destination crm --since 2026-11-29 --until 2026-11-30""",
    "fake-provider": """A test tool: a local Graph API (POST /{version}/{phone_number_id}/messages)
and Tenashi API on GATEWAY_FAKE_HOST:GATEWAY_FAKE_PORT (127.0.0.1:8090). It records every message
a customer would have received (GET /_fake/received), injects scripted faults
(POST /_fake/faults) and posts signed status webhooks to GATEWAY_FAKE_WEBHOOK_URL.
See the README's demo.""",
    "settings": """Print every variable the gateway reads, its default and what it does. Settings come only
from the environment; an unknown GATEWAY_* variable (a typo) is reported at start-up.""",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gateway",
        description="WhatsApp Cloud API webhook gateway: durable ingest, exactly-once processing, "
        "at-most-once sends. `gateway COMMAND --help` says more about each command; settings come "
        "from GATEWAY_* variables (`gateway settings`).",
    )
    parser.add_argument("--version", action="version", version=f"gateway {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (help_text, _fn, add_args) in COMMANDS.items():
        p = sub.add_parser(
            name,
            help=help_text,
            description=HELP.get(name, help_text),
            epilog="Settings: GATEWAY_* environment variables, listed by `gateway settings`.",
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        if add_args:
            add_args(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    try:
        settings = Settings.from_env(os.environ)
    except SettingsError as exc:
        print(f"gateway: {exc}", file=sys.stderr)
        return 2
    secrets = settings.secret_values()
    runtime.setup_logging(settings.log_level, settings.log_format, secrets)
    for name, close in unknown_variables(os.environ):
        hint = f" (did you mean {close}?)" if close else ""
        log.warning("unknown variable %s is ignored%s; `gateway settings` lists them all", name, hint)
    tracing.configure(os.environ)
    _help, fn, _args = COMMANDS[ns.command]
    try:
        return fn(settings, ns)
    except StartupError as exc:
        line = str(exc)
        for secret in secrets:
            line = line.replace(secret, "***")
        print(f"gateway: {line}", file=sys.stderr)
        return EXIT_STARTUP
    finally:
        tracing.shutdown()
