"""Prometheus metrics, defined once per process on the default registry."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

# Ingest edge
WEBHOOK_REQUESTS = Counter(
    "gateway_webhook_requests_total",
    "Webhook POSTs by source and outcome",
    ["source", "outcome"],
)
ACK_LATENCY = Histogram(
    "gateway_ack_latency_seconds",
    "Time from request body read to response, for staged webhooks",
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
HTTP_CONNECTIONS = Gauge("gateway_http_connections", "Open HTTP connections")
HTTP_CONNECTIONS_REFUSED = Counter(
    "gateway_http_connections_refused_total", "Connections closed at once: GATEWAY_MAX_CONNECTIONS reached"
)
WEBHOOK_BODY_BYTES_INFLIGHT = Gauge(
    "gateway_webhook_body_bytes_inflight", "Webhook body bytes reserved by requests being read"
)
COMMIT_FAILURES = Counter("gateway_commit_failures_total", "Group-commit batches that failed")
INBOX_DEPTH = Gauge("gateway_inbox_depth", "Staged webhook rows not yet processed")

# Send side (outbox, sender, reconciler)
SENDS = Counter(
    "gateway_sends_total",
    "Send attempts by provider, resulting outbox state and provider error code",
    ["provider", "outcome", "code"],
)
OUTBOX_ROWS = Gauge("gateway_outbox_rows", "Outbox rows by state", ["state"])
OLDEST_UNKNOWN = Gauge(
    "gateway_outbox_oldest_unknown_seconds", "Age of the oldest outbox row in state unknown (0: none)"
)
BREAKER_TRIPS = Counter(
    "gateway_breaker_trips_total",
    "Circuit breakers opened (or reopened) by an account-level error, by scope, provider and code",
    ["scope", "provider", "code"],
)
BREAKER_STATE = Gauge(
    "gateway_breaker_state",
    "Circuit breaker state per sending number / tenant token: 0 closed, 1 half-open, 2 open",
    ["scope", "provider", "key"],
)
RECONCILE_WAITING = Gauge(
    "gateway_reconcile_waiting_rows",
    "Unknown outbox rows past their window that wait because webhooks of their period are unprocessed",
)
RECONCILE_WATERMARK_LAG = Gauge(
    "gateway_reconcile_watermark_lag_seconds",
    "Age of the oldest unprocessed (pending or dead) webhook a waiting unknown row waits for (0: none)",
)

# Consumers (exactly-once processing of staged webhooks)
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
    "Staged rows parked as dead, by reason (unparseable, max_attempts)",
    ["reason"],
)
CONSUMER_FAILURES = Counter(
    "gateway_consumer_failures_total", "Staged rows whose processing failed and will be retried"
)
CONSUMER_LAG = Gauge("gateway_consumer_lag_seconds", "Age of the oldest due pending staged row")
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
CONSUMER_FALLBACKS = Counter(
    "gateway_consumer_fallbacks_total", "Batches that failed and were retried one row at a time"
)
RETENTION_PURGED = Counter("gateway_retention_purged_total", "Rows purged by retention", ["table"])

# Forwarding to downstream destinations
FORWARD_DELIVERIES = Counter(
    "gateway_forward_deliveries_total",
    "Delivery attempts by destination and outcome (delivered, retry, failed)",
    ["destination", "outcome"],
)
FORWARD_LATENCY = Histogram(
    "gateway_forward_latency_seconds",
    "Webhook receipt to the destination's 2xx, per delivered event",
    ["destination"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 60.0, 600.0, 3600.0),
)
FORWARD_BACKLOG = Gauge(
    "gateway_forward_backlog", "Deliveries pending or in flight, per destination", ["destination"]
)
FORWARD_OLDEST_DUE = Gauge(
    "gateway_forward_oldest_due_seconds",
    "Age (since receipt) of the oldest due pending delivery, per destination (0: none)",
    ["destination"],
)
FORWARD_BREAKER = Gauge(
    "gateway_forward_breaker_state",
    "Circuit breaker per destination: 0 closed, 1 half-open, 2 open",
    ["destination"],
)
