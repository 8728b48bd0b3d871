-- The harness's view of forwarding (deliveries), for run --forward (forwardcheck),
-- bench-forward and bench-pipeline: one place to adapt when the deliveries' storage changes.

-- name: fw_keys_processed_since
SELECT event_key FROM processed_webhook_events WHERE inbox_id > $1;

-- name: fw_states
-- Deliveries by state (every destination).
SELECT state, count(*) AS n FROM deliveries GROUP BY state;

-- name: fw_received_at
-- When the gateway received each delivered event (Unix seconds), by webhook id.
SELECT webhook_id, extract(epoch FROM received_at)::float8 AS at FROM deliveries;

-- name: fw_delivery_keys
SELECT event_key FROM deliveries;

-- name: fw_bodies_like
-- The queued deliveries of the events whose keys match $1: webhook id and the exact body.
SELECT webhook_id, envelope::text AS body FROM deliveries WHERE event_key LIKE $1;

-- name: fw_delivered_like
SELECT count(*) FROM deliveries WHERE state = 'delivered' AND event_key LIKE $1;

-- name: fw_open_of_destination
-- Deliveries of destination $1 still to deliver (the queue holds only open ones).
SELECT count(*) FROM delivery_queue WHERE destination_id = $1 AND NOT failed;

-- name: fw_states_like
SELECT state, count(*) AS n FROM deliveries WHERE event_key LIKE $1 GROUP BY state;

-- name: fw_reset_inbox
-- Between a benchmark's phases: what an earlier phase staged is not this phase's work.
TRUNCATE webhook_inbox;
