"""Backfill a destination from events the gateway already processed, in a receipt time range.

Events are rebuilt from the side-effect tables (``inbound_messages``, ``message_statuses``,
``account_errors``, ``account_updates``) and enveloped by the same pure function the consumers
use, so a backfilled delivery has the same body and ``webhook-id`` a live one would have had;
events the destination already has (same key) are skipped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gateway.core.destinations import conversation_of, kind_of, number_of
from gateway.core.envelope import envelope
from gateway.core.event_rows import (
    account_error_from_row,
    account_update_from_row,
    message_from_row,
    status_from_row,
)
from gateway.core.events import Event, Status
from gateway.store import deliveries
from gateway.store.db import Conn

PAGE = 500


@dataclass
class Backfilled:
    inserted: int = 0
    seen: int = 0
    skipped_no_key: int = 0
    per_table: dict[str, int] = field(default_factory=dict)


def _rebuild(query: str, row: dict[str, Any]) -> tuple[Event, str] | None:
    """The event and its source from one table row; None when its key is gone."""
    if query == "backfill_messages":
        if not row["event_key"]:
            return None
        return message_from_row(row, row["event_key"]), row["source"]
    if query == "backfill_statuses":
        return status_from_row(row), row["source"]
    if query == "backfill_account_errors":
        return account_error_from_row(row), "meta"
    ev = account_update_from_row(row)
    return ev, "tenashi" if ev.field.startswith("tenashi:") else "meta"


async def backfill(conn: Conn, *, destination: str, since: datetime, until: datetime) -> Backfilled:
    """Deliveries to ``destination`` for its event kinds received in [since, until)."""
    dest = await deliveries.get_destination(conn, name=destination)
    if dest is None:
        raise LookupError(f"no destination named {destination!r}")
    out = Backfilled()
    for kind in dest["events"]:
        for query in deliveries.BACKFILL_QUERIES[kind]:
            after = 0
            while True:
                page = await deliveries.backfill_page(
                    conn, query=query, since=since, until=until, after_id=after, limit=PAGE
                )
                if not page:
                    break
                after = page[-1]["id"]
                rows: list[dict[str, Any]] = []
                for r in page:
                    out.seen += 1
                    rebuilt = _rebuild(query, r)
                    if rebuilt is None:
                        out.skipped_no_key += 1
                        continue
                    ev, source = rebuilt
                    rows.append(
                        {
                            "key": ev.key,
                            "kind": kind_of(ev),
                            "conversation": conversation_of(ev),
                            "envelope": envelope(ev, source),
                            "received_at": r["received_at"],
                            "number": number_of(ev),
                            "callback": ev.callback_data if isinstance(ev, Status) else None,
                        }
                    )
                n = await deliveries.insert_rebuilt(conn, destination_id=dest["id"], rows=rows)
                out.inserted += n
                out.per_table[query] = out.per_table.get(query, 0) + n
    return out
