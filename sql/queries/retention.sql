-- Retention: bounded DELETE batches (never one long lock); callers loop until a batch is short.

-- name: processed_webhook_events_purge
DELETE FROM processed_webhook_events
WHERE ctid IN (
    SELECT ctid FROM processed_webhook_events
    WHERE processed_at < now() - make_interval(days => $1)
    LIMIT $2
);

-- name: inbox_purge_done
DELETE FROM webhook_inbox
WHERE ctid IN (
    SELECT ctid FROM webhook_inbox
    WHERE state = 'done' AND processed_at < now() - make_interval(days => $1)
    LIMIT $2
);

-- name: deliveries_purge_delivered
-- Delivered deliveries received before the horizon (failed ones stay for replay), through the
-- (destination_id, received_at) index.
DELETE FROM deliveries
WHERE ctid IN (
    SELECT ctid FROM deliveries
    WHERE destination_id = ANY (ARRAY(SELECT id FROM destinations))
      AND received_at < now() - make_interval(days => $1)
      AND state = 'delivered'
    LIMIT $2
);

-- name: message_statuses_purge
DELETE FROM message_statuses
WHERE ctid IN (
    SELECT ctid FROM message_statuses
    WHERE recorded_at < now() - make_interval(days => $1)
    LIMIT $2
);

-- name: dead_events_purge_done
-- Dead items a retry or a replay finished (kept for the record, like processed inbox rows).
DELETE FROM dead_events
WHERE ctid IN (
    SELECT ctid FROM dead_events
    WHERE state = 'done' AND updated_at < now() - make_interval(days => $1)
    LIMIT $2
);
