"""Dead letters: staged rows parked after max attempts or because they could not be parsed.

Their raw bytes stay in ``webhook_inbox``; ``gateway dead list`` shows them and
``gateway dead replay ID...|--all`` puts them back in the queue with a fresh attempt
budget once the cause is fixed. Replaying is safe: an event already processed is a
duplicate by its key and does nothing.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

import asyncpg

from gateway.cli import command, with_connection
from gateway.settings import Settings
from gateway.sqlfiles import q


async def list_dead(conn: asyncpg.Connection | asyncpg.Pool, limit: int = 100) -> list[dict[str, Any]]:
    return [dict(r) for r in await conn.fetch(q("dead_list"), limit)]


async def replay(conn: asyncpg.Connection, ids: Sequence[int] | None) -> list[int]:
    """Dead rows back to pending (``ids=None``: every dead row); returns the ids replayed."""
    async with conn.transaction():
        rows = await conn.fetch(q("dead_replay"), None if ids is None else list(ids))
        if rows:
            await conn.execute(q("notify_inbox"))
    return sorted(r["id"] for r in rows)


def _args(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=("list", "replay"))
    p.add_argument("ids", nargs="*", type=int, metavar="ID", help="rows to replay")
    p.add_argument("--all", action="store_true", help="replay every dead row")
    p.add_argument("--limit", type=int, default=100, help="rows to list (default 100)")


def _one_line(text: str | None, width: int = 100) -> str:
    return " ".join((text or "").split())[:width]


@command("dead", "dead letters: `dead list`, `dead replay ID...` or `dead replay --all`", _args)
def cmd_dead(settings: Settings, ns: argparse.Namespace) -> int:
    if ns.action == "replay" and not ns.ids and not ns.all:
        print("gateway dead replay: give row ids or --all", file=sys.stderr)
        return 2
    if ns.action == "replay" and ns.ids and ns.all:
        print("gateway dead replay: give row ids or --all, not both", file=sys.stderr)
        return 2

    async def work(conn: asyncpg.Connection) -> int:
        if ns.action == "list":
            rows = await list_dead(conn, ns.limit)
            total = await conn.fetchval(q("dead_count"))
            for r in rows:
                print(
                    f"{r['id']:>10} {r['source']:8} {r['received_at']:%Y-%m-%dT%H:%M:%S%z} "
                    f"attempts={r['attempts']} bytes={r['bytes']} {_one_line(r['last_error'])}"
                )
            print(f"{total} dead row(s)" + (f", {len(rows)} shown" if total > len(rows) else ""))
            return 0
        done = await replay(conn, None if ns.all else ns.ids)
        print(f"replayed {len(done)} row(s): {done}" if done else "nothing to replay")
        missing = sorted(set(ns.ids) - set(done))
        if missing:
            print(f"not dead (or unknown): {missing}")
        return 0 if not missing else 1

    return with_connection(settings, work)
