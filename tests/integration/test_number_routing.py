"""Destinations and handlers limited to business numbers; a tenant's destination sees only the
numbers bound to that tenant."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest

from gateway.cli.downstream import _numbers
from gateway.core.events import Event
from gateway.core.settings import Settings
from gateway.handlers import Registry
from gateway.inbound.consumer import Consumer
from gateway.outbound.backfill import backfill
from gateway.store import deliveries
from gateway.testing.payloads import message_obj, meta_payload, meta_value, status_obj, to_bytes
from tests.support.config import DESTINATION_SECRET as SECRET
from tests.support.consume import drain, stage

BOUND = (("acme", "1111"), ("acme", "3333"), ("globex", "2222"))


def message_to(number: str, wamid: str) -> bytes:
    value = meta_value(messages=[message_obj(wamid)], phone_number_id=number)
    return to_bytes(meta_payload(("messages", value)))


def status_from(number: str, wamid: str) -> bytes:
    value = meta_value(statuses=[status_obj(wamid, "delivered")], phone_number_id=number)
    return to_bytes(meta_payload(("messages", value)))


async def add(pool: asyncpg.Pool, name: str, numbers: list[str] | None, tenant: str | None = None) -> None:
    await deliveries.add_destination(
        pool,
        name=name,
        url=f"http://127.0.0.1:9/{name}",
        events=["message", "status", "account"],
        secret=SECRET,
        max_in_flight=4,
        ordered=False,
        numbers=numbers,
        tenant=tenant,
    )


async def queued(pool: asyncpg.Pool) -> dict[str, list[str]]:
    rows = await pool.fetch(
        "SELECT d.name, x.event_key FROM deliveries x JOIN destinations d ON d.id = x.destination_id"
        " ORDER BY d.name, x.event_key"
    )
    out: dict[str, list[str]] = {}
    for r in rows:
        out.setdefault(r["name"], []).append(r["event_key"])
    return out


async def test_destinations_get_only_their_numbers_events(pool: asyncpg.Pool, settings: Settings) -> None:
    await add(pool, "all", None)
    await add(pool, "acme", ["1111", "3333"], tenant="acme")
    await add(pool, "globex", ["2222"], tenant="globex")
    await stage(pool, message_to("1111", "wamid.A1"))
    await stage(pool, message_to("2222", "wamid.G1"))
    await stage(pool, status_from("3333", "wamid.A3"))
    # A template status update names no number: only unlimited destinations get it.
    await stage(pool, to_bytes(meta_payload(("message_template_status_update", {"event": "APPROVED"}))))
    await drain(pool, settings)
    got = await queued(pool)
    assert got["acme"] == ["msg:wamid.A1", "status:wamid.A3:delivered:"]
    assert got["globex"] == ["msg:wamid.G1"]
    assert len(got["all"]) == 4

    # Backfill keeps to the destination's numbers too.
    await pool.execute("DELETE FROM delivery_queue")
    since = datetime.now(UTC) - timedelta(hours=1)
    until = datetime.now(UTC) + timedelta(hours=1)
    for name in ("acme", "globex", "all"):
        await backfill(pool, destination=name, since=since, until=until)  # type: ignore[arg-type]
    assert await queued(pool) == got


@pytest.mark.parametrize(
    ("numbers", "tenant", "expected"),
    [
        (None, None, None),
        ("2222,1111,1111", None, ["1111", "2222"]),
        (None, "acme", ["1111", "3333"]),
        ("3333", "acme", ["3333"]),
        ("2222", "acme", "--numbers 2222: not bound to tenant acme"),
        (None, "initech", "--tenant initech: GATEWAY_TENANT_NUMBERS binds no numbers to it"),
        ("11 11", None, "--numbers: '11 11' is not a phone_number_id"),
        (",", None, "--numbers needs at least one phone_number_id"),
    ],
)
def test_destination_numbers_from_the_command_line(
    settings: Settings, numbers: str | None, tenant: str | None, expected: Any
) -> None:
    s = dataclasses.replace(settings, tenant_numbers=BOUND)
    if isinstance(expected, str):
        with pytest.raises(ValueError, match="^" + expected.replace("(", r"\(").replace(")", r"\)")):
            _numbers(s, numbers, tenant)
    else:
        assert _numbers(s, numbers, tenant) == expected


async def test_handlers_limited_to_numbers(pool: asyncpg.Pool, settings: Settings) -> None:
    seen: list[tuple[str, str]] = []
    registry = Registry()

    @registry.message(numbers=["1111"])
    async def acme_bot(event: Event, conn: Any) -> None:
        seen.append(("message", event.key))

    @registry.status("delivered", numbers=["2222"])
    async def globex_statuses(event: Event, conn: Any) -> None:
        seen.append(("status", event.key))

    for body in (
        message_to("1111", "wamid.A1"),
        message_to("2222", "wamid.G1"),
        status_from("1111", "wamid.A2"),
        status_from("2222", "wamid.G2"),
    ):
        await stage(pool, body)
    consumer = Consumer(pool, settings, handlers=registry)
    while await consumer.step():
        pass
    assert sorted(seen) == [("message", "msg:wamid.A1"), ("status", "status:wamid.G2:delivered:")]
