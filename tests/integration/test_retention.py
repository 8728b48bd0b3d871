"""Retention purges old rows in bounded batches and keeps everything else; start-up refuses < 7 days."""

from __future__ import annotations

import asyncpg
import pytest
from prometheus_client import REGISTRY

from gateway.core.settings import Settings, SettingsError
from gateway.maintenance import retention
from gateway.testing.payloads import message_obj, messages_payload, status_obj, statuses_payload, to_bytes
from tests.conftest import replace
from tests.consume_helpers import drain, stage


@pytest.mark.parametrize("days", ["1", "6"])
def test_dedup_retention_below_seven_days_is_refused(days: str) -> None:
    with pytest.raises(SettingsError) as err:
        Settings.from_env({"GATEWAY_DEDUP_RETENTION_DAYS": days})
    assert f"GATEWAY_DEDUP_RETENTION_DAYS: must be >= 7 (Meta redelivers for 7 days), got {days}" in str(
        err.value
    )


def test_dedup_retention_of_seven_days_is_accepted() -> None:
    assert Settings.from_env({"GATEWAY_DEDUP_RETENTION_DAYS": "7"}).dedup_retention_days == 7


async def test_purge_in_bounded_batches_keeps_recent_pending_and_dead(
    pool: asyncpg.Pool, settings: Settings
) -> None:
    for i in range(23):
        await stage(pool, to_bytes(messages_payload(message_obj(f"wamid.old{i}"))))
        await stage(pool, to_bytes(statuses_payload(status_obj(f"wamid.s{i}", "sent"))))
    await drain(pool, settings)
    # Age what was just processed past every retention.
    await pool.execute("UPDATE processed_webhook_events SET processed_at = now() - interval '31 days'")
    await pool.execute("UPDATE webhook_inbox SET processed_at = now() - interval '8 days'")
    await pool.execute("UPDATE message_statuses SET recorded_at = now() - interval '91 days'")
    # Fresh rows, and old rows that are not done, must survive.
    await stage(pool, to_bytes(messages_payload(message_obj("wamid.new"))))
    await stage(pool, to_bytes(statuses_payload(status_obj("wamid.snew", "sent"))))
    await drain(pool, settings)
    pending = await stage(pool, b"{}")
    dead = await stage(pool, b"not json")
    await pool.execute(
        "UPDATE webhook_inbox SET state = 'dead', processed_at = now() - interval '30 days' WHERE id = $1",
        dead,
    )

    # Dead items: only those a retry or replay finished long ago go; dead and retrying stay.
    for i, (state, age) in enumerate([("done", 30), ("done", 30), ("dead", 30), ("retry", 30), ("done", 0)]):
        await pool.execute(
            "INSERT INTO dead_events (inbox_id, position, path, kind, source, received_at, unit,"
            " fragment, state, updated_at) VALUES (1, $1::int, '/x/' || $1::int, 'bad', 'meta', now(),"
            " 'message', '{}', $2, now() - make_interval(days => $3))",
            i,
            state,
            age,
        )

    s = replace(settings, purge_batch=7)
    deleted = await retention.purge(pool, s)
    assert deleted == {
        "processed_webhook_events": 46,
        "webhook_inbox": 46,
        "message_statuses": 23,
        "deliveries": 0,
        "dead_events": 2,
    }
    assert sorted(r[0] for r in await pool.fetch("SELECT state FROM dead_events")) == [
        "dead",
        "done",
        "retry",
    ]
    assert await pool.fetchval("SELECT count(*) FROM processed_webhook_events") == 2
    assert sorted(r[0] for r in await pool.fetch("SELECT state FROM webhook_inbox")) == [
        "dead",
        "done",
        "done",
        "pending",
    ]
    assert await pool.fetchval("SELECT id FROM webhook_inbox WHERE state = 'pending'") == pending
    assert await pool.fetchval("SELECT wamid FROM message_statuses") == "wamid.snew"
    assert await pool.fetchval("SELECT count(*) FROM inbound_messages") == 24  # the feed is not purged here
    assert await retention.purge(pool, s) == {
        "processed_webhook_events": 0,
        "webhook_inbox": 0,
        "message_statuses": 0,
        "deliveries": 0,
        "dead_events": 0,
    }
    assert REGISTRY.get_sample_value("gateway_retention_purged_total", {"table": "message_statuses"}) >= 23


async def test_metrics_count_processed_and_duplicates(pool: asyncpg.Pool, settings: Settings) -> None:
    def sample(name: str, **labels: str) -> float:
        return REGISTRY.get_sample_value(name, labels) or 0.0

    before = (
        sample("gateway_consumer_events_total", kind="message", outcome="processed"),
        sample("gateway_consumer_events_total", kind="message", outcome="duplicate"),
        sample("gateway_consumer_duplicates_total"),
        sample("gateway_dead_letters_total", reason="unparseable"),
    )
    body = to_bytes(messages_payload(message_obj("wamid.m1"), message_obj("wamid.m2")))
    for _ in range(3):
        await stage(pool, body)
    await stage(pool, b"<html>")
    await drain(pool, settings)
    after = (
        sample("gateway_consumer_events_total", kind="message", outcome="processed"),
        sample("gateway_consumer_events_total", kind="message", outcome="duplicate"),
        sample("gateway_consumer_duplicates_total"),
        sample("gateway_dead_letters_total", reason="unparseable"),
    )
    assert [a - b for a, b in zip(after, before, strict=True)] == [2, 0, 4, 1]
