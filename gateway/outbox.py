"""The outbox: one row per business event (tenant, key), and the operator commands over it."""

from __future__ import annotations

import argparse
import hashlib
import sys
from dataclasses import dataclass
from typing import Any

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from gateway.cli import command, with_connection
from gateway.settings import Settings
from gateway.sqlfiles import q

# Tenashi takes it as an Idempotency-Key (Stripe's limit: 255); Meta allows 512.
MAX_CALLBACK_DATA = 255
POLICIES = ("resend", "review")
Conn = asyncpg.Connection | asyncpg.Pool | PoolConnectionProxy
STATES = ("pending", "sending", "accepted", "unknown", "failed", "review", "cancelled")


def callback_data(tenant: str, key: str) -> str:
    """Globally unique and opaque: ``<tenant>:<key>``, or a hash of both when that is too long.

    Tenants never contain ':' (GATEWAY_API_KEYS splits on the first one), so the plain form
    cannot collide across tenants.
    """
    plain = f"{tenant}:{key}"
    if len(plain) <= MAX_CALLBACK_DATA:
        return plain
    digest = hashlib.sha256(tenant.encode() + b"\0" + key.encode()).hexdigest()
    return f"sha256:{digest}"


@dataclass(frozen=True, slots=True)
class NewMessage:
    tenant: str
    key: str
    provider: str
    phone_number_id: str
    recipient: str
    payload: dict[str, Any]
    unknown_policy: str = "review"


async def enqueue(conn: Conn, m: NewMessage) -> tuple[bool, asyncpg.Record]:
    """Insert the row unless (tenant, key) exists; returns (created, row)."""
    if m.unknown_policy not in POLICIES:
        raise ValueError(f"unknown_policy must be one of {POLICIES}")
    created = await conn.fetchrow(
        q("outbox_enqueue"),
        m.tenant,
        m.key,
        callback_data(m.tenant, m.key),
        m.provider,
        m.phone_number_id,
        m.recipient,
        m.payload,
        m.unknown_policy,
    )
    row = await conn.fetchrow(q("outbox_get"), m.tenant, m.key)
    assert row is not None
    return created is not None, row


async def get(conn: Conn, tenant: str, key: str) -> asyncpg.Record | None:
    row: asyncpg.Record | None = await conn.fetchrow(q("outbox_get"), tenant, key)
    return row


class AmbiguousKey(Exception):
    pass


async def _resolve_tenant(conn: asyncpg.Connection, key: str, tenant: str | None) -> str | None:
    rows = await conn.fetch(q("outbox_tenants_for_key"), key, tenant)
    if not rows:
        return None
    if len(rows) > 1:
        raise AmbiguousKey(", ".join(r["tenant"] for r in rows))
    tenant_name: str = rows[0]["tenant"]
    return tenant_name


async def release(conn: asyncpg.Connection, key: str, tenant: str | None = None) -> str:
    """review/unknown/failed → pending (an operator decided to send). Returns a one-line result."""
    return await _transition(conn, "outbox_release", key, tenant, "released")


async def cancel(conn: asyncpg.Connection, key: str, tenant: str | None = None) -> str:
    """pending/review/unknown/failed → cancelled."""
    return await _transition(conn, "outbox_cancel", key, tenant, "cancelled")


async def _transition(conn: asyncpg.Connection, query: str, key: str, tenant: str | None, verb: str) -> str:
    found = await _resolve_tenant(conn, key, tenant)
    if found is None:
        raise LookupError(f"no outbox row with key {key!r}" + (f" for tenant {tenant!r}" if tenant else ""))
    state = await conn.fetchval(q(query), found, key)
    if state is None:
        row = await conn.fetchrow(q("outbox_get"), found, key)
        current = row["state"] if row else "gone"
        raise ValueError(f"{found}/{key} is {current}: not {verb}")
    return f"{found}/{key} {verb}: now {state}"


# --- command line -------------------------------------------------------------------------


def _outbox_args(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", required=True)
    ls = sub.add_parser("list", help="list outbox rows in a state")
    ls.add_argument("--state", default="review", choices=STATES)
    ls.add_argument("--limit", type=int, default=100)
    actions = (("release", "send a review/unknown/failed row (again)"), ("cancel", "never send it"))
    for name, help_text in actions:
        a = sub.add_parser(name, help=help_text)
        a.add_argument("key")
        a.add_argument("--tenant", default=None, help="needed when several tenants use the key")


@command("outbox", "list, release or cancel outbox rows", _outbox_args)
def cmd_outbox(settings: Settings, ns: argparse.Namespace) -> int:
    async def work(conn: asyncpg.Connection) -> int:
        if ns.action == "list":
            rows = await conn.fetch(q("outbox_list_state"), ns.state, ns.limit)
            print("tenant\tkey\tstate\trecipient\tattempts\tcode\terror\tupdated_at")
            for r in rows:
                cols = [r["tenant"], r["idem_key"], r["state"], r["recipient"], r["attempts"]]
                cols += [r["last_error_code"] or "", r["last_error"] or "", r["updated_at"].isoformat()]
                print("\t".join(str(c) for c in cols))
            return 0
        fn = release if ns.action == "release" else cancel
        try:
            print(await fn(conn, ns.key, ns.tenant))
        except AmbiguousKey as exc:
            print(f"gateway: key {ns.key!r} is used by tenants {exc}: pass --tenant", file=sys.stderr)
            return 2
        except (LookupError, ValueError) as exc:
            print(f"gateway: {exc}", file=sys.stderr)
            return 1
        return 0

    return with_connection(settings, work)
