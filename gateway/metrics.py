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
