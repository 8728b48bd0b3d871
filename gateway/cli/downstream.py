"""Downstream commands: destinations and their deliveries."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from urllib.parse import urlsplit

import asyncpg
from aiohttp.resolver import DefaultResolver

from gateway.cli.common import actor, actor_args, one_line, when
from gateway.core import delivery_outcomes, destinations, stdwebhooks, tenancy
from gateway.core.settings import Settings
from gateway.operator import actions
from gateway.outbound.egress import url_refused
from gateway.runtime.database import with_connection
from gateway.store import deliveries

log = logging.getLogger("gateway")


def destinations_args(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", required=True)
    add = sub.add_parser("add", help="add a destination (takes effect without a restart)")
    add.add_argument("name")
    add.add_argument("url")
    add.add_argument("--events", required=True, help="comma-separated: message,status,account")
    add.add_argument(
        "--secret",
        help="whsec_<base64 of 24..64 bytes>; omitted: one is generated and printed once "
        "(--format meta: any string, e.g. the bot's Meta app secret)",
    )
    add.add_argument(
        "--format",
        choices=destinations.FORMATS,
        default="standard",
        help="standard: Standard Webhooks envelope (default); meta: each event as its own Meta "
        "webhook body signed X-Hub-Signature-256, for a bot written against Meta's webhooks",
    )
    add.add_argument("--max-in-flight", type=int, default=16, help="requests in flight at once (default 16)")
    add.add_argument("--ordered", action="store_true", help="one delivery in flight per customer wa_id")
    add.add_argument(
        "--numbers", help="comma-separated phone_number_ids: only their events (default: every number's)"
    )
    add.add_argument(
        "--tenant",
        help="a tenant's destination: only events of the numbers GATEWAY_TENANT_NUMBERS binds to it "
        "now (with --numbers: those of them)",
    )
    actor_args(add)
    sub.add_parser("list", help="destinations, breaker state, backlog")
    rot = sub.add_parser(
        "rotate-secret",
        help="sign with a new secret; the current one stays valid (signed with too) for --grace-h hours",
    )
    rot.add_argument("name")
    rot.add_argument(
        "--secret",
        help="whsec_<base64 of 24..64 bytes>; omitted: one is generated and printed once "
        "(a Meta-format destination: any string, with --grace-h 0)",
    )
    rot.add_argument(
        "--grace-h",
        type=float,
        default=24.0,
        help="hours the current secret stays valid (default 24; 0: none)",
    )
    actor_args(rot)
    for name, help_text in (
        ("disable", "stop forwarding to it (new events are not queued for it meanwhile)"),
        ("enable", "resume forwarding to it"),
        ("remove", "delete it and its deliveries"),
    ):
        a = sub.add_parser(name, help=help_text)
        a.add_argument("name")
        actor_args(a)


def _refused(url: str) -> str | None:
    """Why a destination URL reaches into a private network now (the forwarder checks again on
    every connection), or None."""

    async def check() -> str | None:
        resolver = DefaultResolver()
        try:
            return await url_refused(url, resolver)
        except OSError as exc:  # not resolvable yet: the connect-time check covers it
            host = urlsplit(url).hostname
            log.warning("destination host %s does not resolve now (%s); added anyway", host, exc)
            return None
        finally:
            await resolver.close()

    return asyncio.run(check())


def _numbers(settings: Settings, given: str | None, tenant: str | None) -> list[str] | None:
    """The numbers a new destination is limited to (None: every number): --numbers, and with
    --tenant only numbers bound to that tenant (all of them when --numbers is not given)."""
    numbers = None if given is None else destinations.parse_numbers(given)
    if tenant is None:
        return numbers
    owned = tenancy.numbers_of(settings, tenant)
    if not owned:
        raise ValueError(f"--tenant {tenant}: GATEWAY_TENANT_NUMBERS binds no numbers to it")
    if numbers is None:
        return sorted(owned)
    foreign = sorted(set(numbers) - owned)
    if foreign:
        raise ValueError(f"--numbers {','.join(foreign)}: not bound to tenant {tenant}")
    return numbers


def _secret(given: str | None, format: str = "standard") -> str:
    """The --secret given (ValueError unless it is valid for the format), or a new one."""
    return destinations.check_secret(format, given) if given is not None else destinations.new_secret(format)


async def _change(
    conn: asyncpg.Connection, who: actions.Actor, ns: argparse.Namespace, secret: str | None
) -> int:
    """add, rotate-secret, enable, disable, remove: through the operators' actions (audited)."""
    if ns.action == "add":
        assert secret is not None
        events = destinations.parse_events(ns.events)
        print(
            await actions.add_destination(
                conn,
                who,
                name=ns.name,
                url=ns.url,
                events=events,
                secret=secret,
                max_in_flight=ns.max_in_flight,
                ordered=ns.ordered,
                numbers=ns.resolved_numbers,
                tenant=ns.tenant,
                format=ns.format,
            )
        )
        if ns.secret is None:
            # The only time the generated secret is shown: the receiver needs it to verify.
            print(f"secret (shown once, give it to the receiver): {secret}")
        return 0
    if ns.action == "rotate-secret":
        rotated = await actions.rotate_secret(conn, who, ns.name, secret=secret, grace_h=ns.grace_h)
        print(
            f"rotated the secret of {ns.name}: the previous one stays valid until "
            f"{rotated.previous_until.isoformat()}"
        )
        if ns.secret is None:
            print(f"new secret (shown once, give it to the receiver): {rotated.secret}")
        return 0
    if ns.action == "remove":
        n = await actions.remove_destination(conn, who, ns.name)
        print(f"removed {ns.name} and its {n} deliveries")
        return 0
    print(await actions.set_enabled(conn, who, ns.name, enabled=ns.action == "enable"))
    return 0


def cmd_destinations(settings: Settings, ns: argparse.Namespace) -> int:
    secret: str | None = None
    if ns.action == "rotate-secret":
        try:
            if not 0 <= ns.grace_h <= actions.MAX_GRACE_H:
                raise ValueError(f"--grace-h must be 0..{actions.MAX_GRACE_H}")
            # The destination's format decides what its secret is (actions.rotate_secret checks,
            # and generates one when none is given).
            secret = ns.secret
        except ValueError as exc:
            print(f"gateway destinations rotate-secret: {exc}", file=sys.stderr)
            return 2
    if ns.action == "add":
        try:
            destinations.check_name(ns.name)
            destinations.check_url(ns.url)
            if not settings.forward_allow_private and (why := _refused(ns.url)):
                raise ValueError(f"{why}; set GATEWAY_FORWARD_ALLOW_PRIVATE=1 to allow private destinations")
            destinations.parse_events(ns.events)
            if not 1 <= ns.max_in_flight <= 10000:
                raise ValueError("--max-in-flight must be 1..10000")
            ns.resolved_numbers = _numbers(settings, ns.numbers, ns.tenant)
            secret = _secret(ns.secret, ns.format)
        except ValueError as exc:
            print(f"gateway destinations add: {exc}", file=sys.stderr)
            return 2

    async def work(conn: asyncpg.Connection) -> int:
        if ns.action != "list":
            try:
                return await _change(conn, actor(ns), ns, secret)
            except actions.Invalid as exc:
                print(f"gateway destinations {ns.action}: {exc}", file=sys.stderr)
                return 2
            except actions.Refused as exc:
                print(f"gateway: {exc}", file=sys.stderr)
                return 1
        print(
            "name\tenabled\tevents\tordered\tmax_in_flight\tbreaker\tfailures\tbacklog\tfailed\tsecret\turl"
            "\tnumbers\ttenant\tformat"
        )
        for d in await deliveries.list_destinations(conn):
            enabled = "False (410 Gone)" if d.gone else d.enabled
            cols = [d.name, enabled, ",".join(d.events), d.ordered, d.max_in_flight, d.breaker_state]
            cols += [
                d.consecutive_failures,
                d.backlog,
                d.failed,
                destinations.mask_secret(d.format, d.secret)
                + (
                    ""
                    if d.previous_secret is None or d.previous_secret_until is None or d.format == "meta"
                    else f" (and {stdwebhooks.mask_secret(d.previous_secret)}"
                    f" until {d.previous_secret_until.isoformat(timespec='seconds')})"
                ),
                d.url,
                ",".join(d.numbers) if d.numbers is not None else "(all)",
                d.tenant or "",
                d.format,
            ]
            print("\t".join(str(c) for c in cols))
        return 0

    return with_connection(settings, work)


def deliveries_args(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", required=True)
    states = [s.value for s in delivery_outcomes.DeliveryState]
    for name, help_text in (
        ("list", "deliveries by destination, receipt time range and state"),
        ("replay", "send finished deliveries again (same webhook-id)"),
        ("backfill", "create deliveries for a destination from events already processed"),
    ):
        a = sub.add_parser(name, help=help_text)
        a.add_argument("--destination", required=name == "backfill")
        a.add_argument("--since", type=when, required=name == "backfill", help="ISO 8601, inclusive")
        a.add_argument("--until", type=when, required=name == "backfill", help="ISO 8601, exclusive")
        if name == "list":
            a.add_argument("--state", choices=states)
            a.add_argument("--limit", type=int, default=100)
        elif name == "replay":
            a.add_argument("--state", choices=("failed", "delivered"), default="failed")
        if name != "list":
            actor_args(a)


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
                cols += [r.received_at.isoformat(), r.last_status or "", one_line(r.last_error)]
                print("\t".join(str(c) for c in cols))
            counts = await deliveries.count_deliveries(
                conn, destination=ns.destination, since=ns.since, until=ns.until
            )
            print("totals: " + (", ".join(f"{k}={v}" for k, v in sorted(counts.items())) or "none"))
            return 0
        if ns.action == "replay":
            n = await actions.replay_deliveries(
                conn, actor(ns), destination=ns.destination, since=ns.since, until=ns.until, state=ns.state
            )
            print(f"replayed {n} {ns.state} deliveries" if n else "nothing to replay")
            return 0
        try:
            b = await actions.backfill_deliveries(
                conn, actor(ns), destination=ns.destination, since=ns.since, until=ns.until
            )
        except LookupError as exc:
            print(f"gateway: {exc}", file=sys.stderr)
            return 1
        print(
            f"backfilled {b.inserted} deliveries from {b.seen} events ({b.seen - b.inserted} already there)"
        )
        if b.skipped_no_key:
            print(f"{b.skipped_no_key} Tenashi messages skipped: their event key was purged")
        return 0

    return with_connection(settings, work)
