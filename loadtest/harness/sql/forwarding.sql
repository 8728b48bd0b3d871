-- The harness's view of forwarding (deliveries), for run --forward (forwardcheck),
-- bench-forward and bench-pipeline: one place to adapt when the deliveries' storage changes.
-- Read from the tables (migration 0021: delivery_events, delivery_queue, delivery_log), not the
-- view deliveries, whose every row joins three of them.

-- name: fw_keys_processed_since
SELECT event_key FROM processed_webhook_events WHERE inbox_id > $1;

-- name: fw_states
-- Deliveries by state (every destination): the open ones in the queue, the delivered ones in
-- the log (migration 0021).
SELECT state, count(*) AS n FROM (
    SELECT CASE WHEN failed THEN 'failed' ELSE 'pending' END AS state FROM delivery_queue
    UNION ALL
    SELECT 'delivered' FROM delivery_log l
    WHERE l.outcome = 'delivered'
      AND NOT EXISTS (SELECT 1 FROM delivery_queue q
                      WHERE q.destination_id = l.destination_id AND q.event_id = l.event_id)
) x GROUP BY state;

-- name: fw_received_at
-- When the gateway received each delivered event (Unix seconds), by webhook id.
SELECT delivery_webhook_id(d.name, e.event_key) AS webhook_id, extract(epoch FROM e.received_at)::float8 AS at
FROM (SELECT destination_id, event_id, event_day, lane FROM delivery_queue
      UNION SELECT destination_id, event_id, event_day, lane FROM delivery_log WHERE outcome = 'delivered') x
JOIN destinations d ON d.id = x.destination_id
JOIN delivery_events e ON e.id = x.event_id AND e.day = x.event_day AND e.lane = x.lane;

-- name: fw_delivery_keys
SELECT e.event_key
FROM (SELECT destination_id, event_id, event_day, lane FROM delivery_queue
      UNION SELECT destination_id, event_id, event_day, lane FROM delivery_log WHERE outcome = 'delivered') x
JOIN delivery_events e ON e.id = x.event_id AND e.day = x.event_day AND e.lane = x.lane;

-- name: fw_bodies_like
-- The queued deliveries of the events whose keys match $1: webhook id and the exact body.
SELECT delivery_webhook_id(d.name, e.event_key) AS webhook_id,
       convert_from(CASE WHEN d.format = 'meta' THEN e.meta_body ELSE e.body END, 'UTF8') AS body
FROM delivery_queue q
JOIN destinations d ON d.id = q.destination_id
JOIN delivery_events e ON e.id = q.event_id AND e.day = q.event_day AND e.lane = q.lane
WHERE e.event_key LIKE $1;

-- name: fw_delivered_like
SELECT count(*) FROM (
    SELECT DISTINCT l.destination_id, l.event_id
    FROM delivery_log l JOIN delivery_events e ON e.id = l.event_id AND e.day = l.event_day AND e.lane = l.lane
    WHERE l.outcome = 'delivered' AND e.event_key LIKE $1
      AND NOT EXISTS (SELECT 1 FROM delivery_queue q
                      WHERE q.destination_id = l.destination_id AND q.event_id = l.event_id)
) x;

-- name: fw_open_of_destination
-- Deliveries of destination $1 still to deliver (the queue holds only open ones).
SELECT count(*) FROM delivery_queue WHERE destination_id = $1 AND NOT failed;

-- name: fw_states_like
SELECT state, count(*) AS n FROM (
    SELECT CASE WHEN q.failed THEN 'failed' ELSE 'pending' END AS state
    FROM delivery_queue q JOIN delivery_events e ON e.id = q.event_id AND e.day = q.event_day AND e.lane = q.lane
    WHERE e.event_key LIKE $1
    UNION ALL
    SELECT 'delivered' FROM (
        SELECT DISTINCT l.destination_id, l.event_id
        FROM delivery_log l JOIN delivery_events e ON e.id = l.event_id AND e.day = l.event_day AND e.lane = l.lane
        WHERE l.outcome = 'delivered' AND e.event_key LIKE $1
          AND NOT EXISTS (SELECT 1 FROM delivery_queue q
                          WHERE q.destination_id = l.destination_id AND q.event_id = l.event_id)) y
) x GROUP BY state;

-- name: fw_reset_inbox
-- Between a benchmark's phases: what an earlier phase staged is not this phase's work.
TRUNCATE webhook_inbox;
