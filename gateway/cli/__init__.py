"""``gateway`` command line: the command table, the parser and ``main``; the commands live in
``processes``, ``operators`` and ``downstream``. Nothing outside this package imports it."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable

from gateway import __version__, tracing
from gateway.cli import guard
from gateway.cli.common import Command
from gateway.cli.downstream import cmd_deliveries, cmd_destinations, deliveries_args, destinations_args
from gateway.cli.operators import (
    cmd_dead,
    cmd_lanes,
    cmd_outbox,
    cmd_senders,
    dead_args,
    outbox_args,
    senders_args,
)
from gateway.cli.processes import (
    cmd_console,
    cmd_consume,
    cmd_fake_provider,
    cmd_forward,
    cmd_migrate,
    cmd_send,
    cmd_serve,
    cmd_settings,
    migrate_args,
    serve_args,
    settings_args,
)
from gateway.core.settings import Settings, SettingsError, unknown_variables
from gateway.runtime import logs
from gateway.runtime.startup import EXIT_STARTUP, StartupError

log = logging.getLogger("gateway")


# name -> (help, function, extra arguments)
COMMANDS: dict[str, tuple[str, Command, Callable[[argparse.ArgumentParser], None] | None]] = {
    "serve": ("run the HTTP gateway (with consumers and sender unless disabled)", cmd_serve, serve_args),
    "migrate": ("apply pending database migrations and exit", cmd_migrate, migrate_args),
    "consume": ("run the consumers alone (no HTTP), until SIGTERM or SIGINT", cmd_consume, None),
    "send": ("run the sender (outbox → provider) and reconciler alone", cmd_send, None),
    "dead": (
        "dead rows and events: `dead list`, `dead show ID`, `dead replay ID...|--all|--since T --until T`",
        cmd_dead,
        dead_args,
    ),
    "outbox": ("list, release or cancel outbox rows (one by key, or in bulk)", cmd_outbox, outbox_args),
    "senders": (
        "circuit breakers: `senders list`, `senders resume number|token KEY`",
        cmd_senders,
        senders_args,
    ),
    "lanes": ("the staging log's lanes: owner, lease and how far each cursor has read", cmd_lanes, None),
    "forward": ("run the forwarder (deliveries → downstream destinations) alone", cmd_forward, None),
    "destinations": (
        "downstream destinations: add NAME URL --events … | list | rotate-secret | disable | enable | remove",
        cmd_destinations,
        destinations_args,
    ),
    "deliveries": (
        "deliveries to destinations: list | replay | backfill (--destination --since --until)",
        cmd_deliveries,
        deliveries_args,
    ),
    "console": ("run the operator console alone (GATEWAY_CONSOLE_PORT)", cmd_console, None),
    "fake-provider": (
        "serve the fake Graph API / Tenashi API on GATEWAY_FAKE_HOST:GATEWAY_FAKE_PORT",
        cmd_fake_provider,
        None,
    ),
    "settings": ("print every variable with its default and what it does", cmd_settings, settings_args),
}


# What `gateway COMMAND --help` says: what the command does, what it needs, how it ends.
HELP: dict[str, str] = {
    "serve": """Run the HTTP gateway: Meta's and Tenashi's webhooks (answered 200 only after the raw body
is committed), the send API (/v1/messages), /healthz and /readyz; /metrics on GATEWAY_METRICS_PORT
(a listener of its own; never the public port, unless it is GATEWAY_PORT itself). Unless switched off
(GATEWAY_RUN_CONSUMERS, GATEWAY_RUN_SENDER, GATEWAY_RUN_FORWARDER = false) it also runs the
consumers, the sender and the forwarder.

Listens on GATEWAY_HOST:GATEWAY_PORT (127.0.0.1:8080). Without DATABASE_URL it starts an
embedded PostgreSQL under GATEWAY_DATA_DIR (./var). Migrations run at start-up unless
GATEWAY_MIGRATE_ON_START=false. Stops cleanly on SIGTERM/SIGINT (pending webhooks are committed
first). Exit codes: 1 a background service failed, or the embedded PostgreSQL stayed down;
2 invalid settings; 3 cannot start (database unreachable, port busy).

Processes, by core count unless set: with two cores or more, HTTP workers on the one port
(--workers N, GATEWAY_WORKERS; default 0 = one per core less one) and one process of its own
for the consumers, sender and forwarder (GATEWAY_SERVE_SERVICES=process); on one core, one
process runs everything (inline). A parent starts the database and migrates once, restarts a
child that dies and forwards SIGTERM; /metrics of any worker reports all (docs/scaling.md).

Examples:
  GATEWAY_META_APP_SECRETS=<app secret> GATEWAY_META_VERIFY_TOKEN=<token> gateway serve
  GATEWAY_METRICS_PORT=9100 gateway serve  # Prometheus scrapes :9100/metrics
  GATEWAY_WORKERS=4 gateway serve          # or: gateway serve --workers 4
  GATEWAY_SERVE_SERVICES=inline gateway serve --workers 1   # one process, everything in it""",
    "migrate": """Apply the pending database migrations and exit (0). Safe to run from several places at
once: migrations are serialised by an advisory lock. Compose runs it once before the other
services; with GATEWAY_MIGRATE_ON_START=false the other commands do not migrate themselves.

On a Citus coordinator, --citus distributes the gateway's tables once the schema is current
(sql/citus/layout.sql; a second run changes nothing); afterwards every migrate there (start-ups
included) checks the layout again. Without --citus, a coordinator whose tables are not
distributed yet is refused (exit 1), and --citus without the extension too (docs/scaling.md).""",
    "consume": """Run the consumers alone, without HTTP: they claim staged webhooks, record each event exactly
once (a redelivery is a duplicate by its key) and park what keeps failing as dead. Any number of
consume processes may share a database. GATEWAY_CONSUMER_CONCURRENCY loops per process.

With GATEWAY_METRICS_PORT set, serves /metrics and /healthz there. Runs until SIGTERM/SIGINT;
exits 1 if it fails on its own.""",
    "send": """Run the sender and the reconciler alone: sends outbox rows to the Graph API (or Tenashi) at
most once, paced per recipient and per number, and settles sends whose fate is unknown
(GATEWAY_RECONCILE_WINDOW_S). Any number of send processes may share a database.

With GATEWAY_METRICS_PORT set, serves /metrics and /healthz there. Runs until SIGTERM/SIGINT;
exits 1 if it fails on its own.""",
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
their policy is review), failed or unknown ones. A release never sends a row the provider
accepted, nor an unknown one inside its reconcile window (GATEWAY_RECONCILE_WINDOW_S from when
its fate became unknown: its status may still come) unless --i-know-it-may-duplicate says the
customer may get it twice (the audit log records it). `gateway outbox release --help` says more.

Examples:
  gateway outbox list --state review
  gateway outbox release order-7781        # send it (again)
  gateway outbox release --state unknown --since 2h
  gateway outbox cancel order-7781 --tenant acme""",
    "senders": """Circuit breakers of the sender, per sending number and per tenant token. An account-level
error from the provider (e.g. a number blocked or a token expired) opens one: its rows stay
pending, a single probe is sent after a doubling wait (GATEWAY_BREAKER_BACKOFF_S), and a
successful probe closes it. Resume by hand once the cause is fixed.

Examples:
  gateway senders list
  gateway senders resume number 1111
  gateway senders resume token acme --provider tenashi""",
    "lanes": """The 32 lanes of the staging log (webhook_inbox) and which consumer process owns each: its
member name (host:pid:token), when its lease runs out (GATEWAY_CONSUMER_LANE_LEASE_S), how many
times its cursor moved and when last, and its cursor's snapshots. A lane with no owner is read
by nobody: start a consumer (`gateway consume`, or `gateway serve`).

Example:
  gateway lanes""",
    "forward": """Run the forwarder alone: delivers processed events to the downstream destinations
(`gateway destinations`), signed, retried with backoff for GATEWAY_FORWARD_RETRY_H, a breaker per
destination. With GATEWAY_METRICS_PORT set, serves /metrics and /healthz there. Runs until
SIGTERM/SIGINT.""",
    "destinations": """Downstream destinations that receive processed events, changed live (no restart).

Examples:
  gateway destinations add crm https://crm.example/hooks --events message,status
  gateway destinations list
  gateway destinations rotate-secret crm --grace-h 24   # old secret still signs for 24 h
  gateway destinations disable crm""",
    "deliveries": """Deliveries to destinations: list them, send failed ones again, or create them from events
processed before the destination existed.

Examples:
  gateway deliveries list --destination crm --state failed
  gateway deliveries replay --destination crm --since 2026-11-30T00:00
  gateway deliveries backfill --destination crm --since 2026-11-29 --until 2026-11-30""",
    "console": """Run the operator console alone: a server-rendered web console on its own listener,
GATEWAY_CONSOLE_HOST:GATEWAY_CONSOLE_PORT (127.0.0.1 by default; never the public webhook port).
Log in with a token of GATEWAY_CONSOLE_TOKENS (name:token[:ro], comma-separated; ro: read-only);
the name goes to the audit log. `gateway serve` also serves it when GATEWAY_CONSOLE_PORT is set
(once, from the parent, under --workers N). Runs until SIGTERM/SIGINT (docs/console.md).

Example:
  GATEWAY_CONSOLE_PORT=8081 GATEWAY_CONSOLE_TOKENS=alice:<32 random chars> gateway console""",
    "fake-provider": """A test tool: a local Graph API (POST /{version}/{phone_number_id}/messages)
and Tenashi API on GATEWAY_FAKE_HOST:GATEWAY_FAKE_PORT (127.0.0.1:8090). It records every message
a customer would have received (GET /_fake/received), injects scripted faults
(POST /_fake/faults) and posts signed status webhooks to GATEWAY_FAKE_WEBHOOK_URL.
See the README's demo.""",
    "settings": """Print every variable the gateway reads, its default and what it does. Settings come only
from the environment; an unknown GATEWAY_* variable (a typo) is reported at start-up.""",
}


def build_parser() -> argparse.ArgumentParser:
    parser = guard.Parser(
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
    logs.setup_logging(settings.log_level, settings.log_format, secrets)
    for name, close in unknown_variables(os.environ):
        hint = f" (did you mean {close}?)" if close else ""
        log.warning("unknown variable %s is ignored%s; `gateway settings` lists them all", name, hint)
    tracing.configure(os.environ)
    _help, fn, _args = COMMANDS[ns.command]
    try:
        return fn(settings, ns)
    except StartupError as exc:
        guard.say(f"gateway: {exc}", secrets)
        return EXIT_STARTUP
    except guard.DATABASE_ERRORS as exc:
        # Every command, one place: the exception's own text (and a traceback) may hold a row.
        guard.say(f"gateway {ns.command}: {guard.database_error(exc)}", secrets)
        return guard.EXIT_REFUSED
    finally:
        tracing.shutdown()
