"""Prometheus metrics, defined once per process on the default registry.

Under ``gateway serve --workers N`` the workers record into a shared PROMETHEUS_MULTIPROC_DIR
(prometheus_client's multiprocess mode) and ``/metrics`` on any of them answers for the whole
group: counters and histograms add up, per-process gauges (open connections, body bytes in
flight) are ``livesum``, and gauges read from the database are ``mostrecent`` (the gauge
leader writes them every few seconds; a former leader's last write is older).

Per-process series (counters, histograms) are summed across replicas by the dashboards.
Database-wide gauges (inbox depth, lag, outbox states, dead letters) live on their own
registry and are exported only by the process that currently holds the gauge leader lock
(``gateway.maintenance.gauges``), so summing replicas never over-counts them.
"""

from __future__ import annotations

import bisect
import platform
import time
from collections.abc import Iterable, Iterator, Sequence

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from gateway import __version__
from gateway.core.enums import OutboxState, Provider, Source
from gateway.store import db

# `_created` series double the series count and no dashboard or alert here reads them.
disable_created_metrics()  # type: ignore[no-untyped-call]

BUILD_INFO = Gauge(
    "gateway_build_info",
    "Always 1; labels say which build runs",
    ["version", "python"],
    multiprocess_mode="max",
)
BUILD_INFO.labels(__version__, platform.python_version()).set(1)

# Ingest edge
WEBHOOK_OUTCOMES = (
    *("stored", "bad_signature", "too_large", "encoded", "busy", "slow", "aborted"),
    *("timeout", "unavailable", "starting", "closed"),
)
WEBHOOK_REQUESTS = Counter(
    "gateway_webhook_requests_total",
    "Webhook POSTs by source and outcome",
    ["source", "outcome"],
)
ACK_LATENCY = Histogram(
    "gateway_ack_latency_seconds",
    "Time from a webhook's staging (body read and verified) to its commit, which its 200 waits for",
    ["source"],
    buckets=(0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
)
COMMIT_BATCH_SIZE = Histogram(
    "gateway_commit_batch_size",
    "Rows written per group-commit transaction",
    buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000),
)
COMMIT_SECONDS = Histogram(
    "gateway_commit_seconds",
    "Duration of one group-commit INSERT+COMMIT",
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
)
HTTP_CONNECTIONS = Gauge("gateway_http_connections", "Open HTTP connections", multiprocess_mode="livesum")
HTTP_CONNECTIONS_REFUSED = Counter(
    "gateway_http_connections_refused_total", "Connections closed at once: GATEWAY_MAX_CONNECTIONS reached"
)
WEBHOOK_BODY_BYTES_INFLIGHT = Gauge(
    "gateway_webhook_body_bytes_inflight",
    "Webhook body bytes reserved by requests being read",
    multiprocess_mode="livesum",
)
COMMIT_FAILURES = Counter("gateway_commit_failures_total", "Group-commit batches that failed")

# Send API (HTTP)
API_REQUESTS = Counter(
    "gateway_api_requests_total",
    "Send API requests by route template, method and status code",
    ["route", "method", "status"],
)
API_LATENCY = Histogram(
    "gateway_api_request_seconds",
    "Send API request duration by route template and method",
    ["route", "method"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
)

# Send side (outbox, sender, reconciler)
SENDS = Counter(
    "gateway_sends_total",
    "Send attempts by provider, resulting outbox state and provider error code",
    ["provider", "outcome", "code"],
)
BREAKER_TRIPS = Counter(
    "gateway_breaker_trips_total",
    "Circuit breakers opened (or reopened) by an account-level error, by scope, provider and code",
    ["scope", "provider", "code"],
)
RECONCILE_WAITING = Gauge(
    "gateway_reconcile_waiting_rows",
    "Unknown outbox rows past their window that wait because webhooks of their period are unprocessed",
    multiprocess_mode="mostrecent",
)
RECONCILE_WATERMARK_LAG = Gauge(
    "gateway_reconcile_watermark_lag_seconds",
    "Age of the oldest unprocessed (pending or dead) webhook a waiting unknown row waits for (0: none)",
    multiprocess_mode="mostrecent",
)

# Consumers (exactly-once processing of staged webhooks)
EVENT_KINDS = ("message", "status", "account_error", "account_update")
CONSUMER_EVENTS = Counter(
    "gateway_consumer_events_total",
    "Events extracted from staged webhooks, by kind and outcome (processed, duplicate)",
    ["kind", "outcome"],
)
CONSUMER_DUPLICATES = Counter(
    "gateway_consumer_duplicates_total", "Events skipped because their key was already processed"
)
DEAD_LETTERS = Counter(
    "gateway_dead_letters_total",
    "Rows and events parked as dead, by reason (unparseable, bad_fragment, max_attempts, stalled)",
    ["reason"],
)
CONSUMER_FAILURES = Counter(
    "gateway_consumer_failures_total", "Staged rows whose processing failed and will be retried"
)
CONSUMER_BATCH_SECONDS = Histogram(
    "gateway_consumer_batch_seconds",
    "Duration of one consumer batch (claim, process, commit)",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0),
)
CONSUMER_BATCH_ROWS = Histogram(
    "gateway_consumer_batch_rows",
    "Staged rows per consumer batch",
    buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000),
)
CONSUMER_FAULTS = Counter(
    "gateway_consumer_faults_total",
    "Batches put off because the database was failing (retried with capped backoff, no attempt counted)",
)
HANDLER_CALLS = Counter("gateway_handler_calls_total", "Handler calls that returned, by outcome", ["outcome"])
REPLIES_REFUSED = Counter(
    "gateway_replies_refused_total",
    "Replies refused by the reply guard (the message was already answered), by who asked: api, handler",
    ["via"],
)
CONSUMER_FALLBACKS = Counter(
    "gateway_consumer_fallbacks_total", "Batches that failed and were retried one row at a time"
)
CONSUMER_FORWARDS_REDONE = Counter(
    "gateway_consumer_forwards_redone_total",
    "Batches planned without forwards while a destination was enabled, applied again with them",
)
RETENTION_TABLES = (
    "processed_webhook_events",
    "reply_claims",
    "outbox",
    "deliveries",
    "dead_events",
    "event_fragments",
)
RETENTION_PURGED = Counter("gateway_retention_purged_total", "Rows purged by retention", ["table"])

# Forwarding to downstream destinations
FORWARD_DELIVERIES = Counter(
    "gateway_forward_deliveries_total",
    "Delivery attempts by destination and outcome (delivered, retry, failed)",
    ["destination", "outcome"],
)
FORWARD_DISABLED = Counter(
    "gateway_forward_destinations_disabled_total",
    "Destinations the forwarder disabled, by reason (gone: the endpoint answered 410 Gone)",
    ["destination", "reason"],
)
FORWARD_LATENCY = Histogram(
    "gateway_forward_latency_seconds",
    "Webhook receipt to the destination's 2xx, per delivered event",
    ["destination"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 60.0, 600.0, 3600.0),
)


class _LeaderOnly(Collector):
    """Yields the database-wide gauges only while this process exports them.

    A process exports them from its first refresh until it loses the leader lock (or its
    last refresh is older than ``max_age_s``: a leader whose refreshes stopped drops out
    by itself instead of exporting frozen numbers next to the new leader's).
    """

    def __init__(self, registry: CollectorRegistry, max_age_s: float = 30.0) -> None:
        self.registry = registry
        self.max_age_s = max_age_s
        self.refreshed_at: float | None = None

    def describe(self) -> Iterable[Metric]:
        return list(self.registry.collect())

    def collect(self) -> Iterator[Metric]:
        at = self.refreshed_at
        if at is not None and time.monotonic() - at <= self.max_age_s:
            yield from self.registry.collect()


DB_REGISTRY = CollectorRegistry(auto_describe=True)
DB_GAUGES = _LeaderOnly(DB_REGISTRY)
REGISTRY.register(DB_GAUGES)

INBOX_DEPTH = Gauge(
    "gateway_inbox_depth",
    "Staged webhook rows not yet processed (database-wide)",
    registry=DB_REGISTRY,
    multiprocess_mode="mostrecent",
)
CONSUMER_LAG = Gauge(
    "gateway_consumer_lag_seconds",
    "Age of the oldest pending staged row, due or put off because the database failed (database-wide)",
    registry=DB_REGISTRY,
    multiprocess_mode="mostrecent",
)
DEAD_EVENTS = Gauge(
    "gateway_dead_events",
    "Events that failed on their own, by state: retry (waiting for a retry), dead (database-wide)",
    ["state"],
    registry=DB_REGISTRY,
    multiprocess_mode="mostrecent",
)
DEAD_EVENTS_OLDEST_RETRY = Gauge(
    "gateway_dead_events_oldest_retry_seconds",
    "Age (since receipt) of the oldest event waiting for a retry (0: none; database-wide)",
    registry=DB_REGISTRY,
    multiprocess_mode="mostrecent",
)
DEAD_ROWS = Gauge(
    "gateway_dead_rows",
    "Staged rows parked as dead, waiting for `gateway dead` (database-wide)",
    registry=DB_REGISTRY,
    multiprocess_mode="mostrecent",
)
# Only the states that drain are counted (each on its partial index, capped: see
# gateway.maintenance.gauges); accepted and cancelled rows are counted by gateway_sends_total.
OPEN_OUTBOX_STATES = (
    OutboxState.PENDING,
    OutboxState.SENDING,
    OutboxState.UNKNOWN,
    OutboxState.REVIEW,
    OutboxState.FAILED,
)
OUTBOX_ROWS = Gauge(
    "gateway_outbox_rows",
    "Outbox rows in the states that drain (database-wide, capped count)",
    ["state"],
    registry=DB_REGISTRY,
    multiprocess_mode="mostrecent",
)
OLDEST_UNKNOWN = Gauge(
    "gateway_outbox_oldest_unknown_seconds",
    "Age of the oldest outbox row in state unknown (0: none; database-wide)",
    registry=DB_REGISTRY,
    multiprocess_mode="mostrecent",
)
GAUGE_LEADER = Gauge(
    "gateway_gauge_leader",
    "1 in the one process exporting the database-wide gauges",
    registry=DB_REGISTRY,
    multiprocess_mode="mostrecent",
)
GAUGE_LEADER.set(1)
BREAKER_STATE = Gauge(
    "gateway_breaker_state",
    "Circuit breaker state per sending number / tenant token: 0 closed, 1 half-open, 2 open (database-wide)",
    ["scope", "provider", "key"],
    registry=DB_REGISTRY,
    multiprocess_mode="mostrecent",
)
FORWARD_BACKLOG = Gauge(
    "gateway_forward_backlog",
    "Deliveries pending or in flight, per destination (database-wide)",
    ["destination"],
    registry=DB_REGISTRY,
    multiprocess_mode="mostrecent",
)
FORWARD_OLDEST_DUE = Gauge(
    "gateway_forward_oldest_due_seconds",
    "Age (since receipt) of the oldest due pending delivery, per destination (0: none; database-wide)",
    ["destination"],
    registry=DB_REGISTRY,
    multiprocess_mode="mostrecent",
)
FORWARD_ENABLED = Gauge(
    "gateway_forward_destination_enabled",
    "1 while a destination is enabled, 0 while disabled (by an operator or a 410 Gone; database-wide)",
    ["destination"],
    registry=DB_REGISTRY,
    multiprocess_mode="mostrecent",
)
FORWARD_BREAKER = Gauge(
    "gateway_forward_breaker_state",
    "Circuit breaker per destination: 0 closed, 1 half-open, 2 open (database-wide)",
    ["destination"],
    registry=DB_REGISTRY,
    multiprocess_mode="mostrecent",
)


def observe_many(histogram: Histogram, values: Sequence[float]) -> None:
    """``histogram.observe(v)`` for each of ``values`` (one labelled child), with one increment
    per bucket touched and one for the sum. ``observe`` takes a lock (and, under ``serve
    --workers``, writes a shared file) per call: per webhook, that was a tenth of the ack path.
    prometheus_client keeps a count per bucket (made cumulative when collected), as this fills it."""
    if not values:
        return
    bounds: Sequence[float] = histogram._upper_bounds
    counts: dict[int, int] = {}
    for v in values:
        i = bisect.bisect_left(bounds, v)  # the first bound >= v, as observe() picks it
        counts[i] = counts.get(i, 0) + 1
    buckets = histogram._buckets
    for i, n in counts.items():
        buckets[i].inc(n)
    histogram._sum.inc(sum(values))


def db_gauges_refreshed() -> None:
    """This process refreshed the database-wide gauges: export them."""
    DB_GAUGES.refreshed_at = time.monotonic()


def db_gauges_withdrawn() -> None:
    """This process no longer exports the database-wide gauges (lost the leader lock)."""
    DB_GAUGES.refreshed_at = None


def _init_series() -> None:
    """Create the label combinations alerts and dashboards read, at 0, before any event."""
    for src in Source:
        ACK_LATENCY.labels(src.value)
        for outcome in WEBHOOK_OUTCOMES:
            WEBHOOK_REQUESTS.labels(src.value, outcome)
    for provider in Provider:
        for state in (OutboxState.ACCEPTED, OutboxState.UNKNOWN, OutboxState.FAILED, OutboxState.PENDING):
            SENDS.labels(provider.value, state.value, "")
    for kind in EVENT_KINDS:
        for outcome in ("processed", "duplicate"):
            CONSUMER_EVENTS.labels(kind, outcome)
    for reason in ("unparseable", "bad_fragment", "max_attempts", "stalled"):
        DEAD_LETTERS.labels(reason)
    for table in RETENTION_TABLES:
        RETENTION_PURGED.labels(table)
    for state in OPEN_OUTBOX_STATES:
        OUTBOX_ROWS.labels(state.value)


_init_series()

# Partitions and retention (gateway.maintenance.retention)
PARTITIONS_DROPPED = Counter(
    "gateway_partitions_dropped_total", "Day partitions dropped by retention", ["table"]
)
PARTITIONS_AHEAD = Gauge(
    "gateway_partitions_ahead_days",
    "Days ahead of today covered by partitions, the least over the partitioned tables, measured "
    "after every maintenance pass, failed or skipped (writes make a missing day on demand; alert "
    "below 2: the job is not keeping up)",
    multiprocess_mode="min",
)
MAINTENANCE_LAST_OK = Gauge(
    "gateway_maintenance_last_ok_timestamp_seconds",
    "When this process last ran a maintenance pass (partitions, retention) in which every step "
    "went through (alert when the newest, over all processes, is 2 hours old)",
    multiprocess_mode="max",
)
MAINTENANCE_FAILURES = Counter(
    "gateway_maintenance_failures_total",
    "Maintenance pass steps that failed (each retried on the next pass)",
)

# Following the writable primary (gateway.store.db.connect_any, gateway.store.listen).
DB_PRIMARY_CHANGES = Counter(
    "gateway_db_primary_changes_total",
    "Times new connections went to another database server than before (a failover)",
)
DB_NO_PRIMARY = Counter(
    "gateway_db_no_primary_total",
    "Connection attempts that found no usable server, by reason (no host writable, none reachable)",
    ["reason"],
)
DB_WRITABLE = Gauge(
    "gateway_db_writable",
    "1 while the readiness probe finds a writable primary with the current schema, else 0",
    multiprocess_mode="min",
)
LISTEN_UP = Gauge(
    "gateway_listen_up",
    "LISTEN sessions up, by channel (0 while reconnecting: work is found by polling meanwhile)",
    ["channel"],
    multiprocess_mode="livesum",
)
LISTEN_SESSIONS = Counter(
    "gateway_listen_sessions_total",
    "LISTEN sessions opened, by channel: more than one each means reconnections",
    ["channel"],
)


def _observe_db(event: str, detail: str) -> None:
    if event == "primary":
        DB_PRIMARY_CHANGES.inc()
    elif event == "no_primary":
        DB_NO_PRIMARY.labels(detail).inc()
    elif event == "listen_up":
        LISTEN_UP.labels(detail).inc()
        LISTEN_SESSIONS.labels(detail).inc()
    elif event == "listen_down":
        LISTEN_UP.labels(detail).dec()


db.observers.append(_observe_db)
