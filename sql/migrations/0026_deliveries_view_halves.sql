-- The deliveries view (one row per delivery, for reading) as the union of two views, the open
-- deliveries and the delivered ones: on a Citus cluster sql/citus/layout.sql collects each half
-- on its own (Citus cannot plan a join or an ORDER BY over the union of two distributed joins),
-- while on one PostgreSQL the union is inlined as before and a condition on it reaches each
-- table's index. The delivered half's look-ups name the lane too: a delivery's queue row and log
-- rows are in its event's lane, so the condition changes no result and keeps each look-up on the
-- row's own shard.
CREATE VIEW deliveries_open AS
SELECT q.event_id AS id, q.destination_id, e.event_key,
       'wh_' || left(encode(sha256(convert_to(d.name || '/' || e.event_key, 'UTF8')), 'hex'), 32) AS webhook_id,
       e.kind, e.conversation,
       convert_from(CASE WHEN d.format = 'meta' THEN e.meta_body ELSE e.body END, 'UTF8')::jsonb AS envelope,
       CASE WHEN q.failed THEN 'failed' ELSE 'pending' END AS state,
       q.attempts, q.due AS next_attempt_at, q.received_at, q.window_start, q.last_status::integer AS last_status,
       q.last_error, NULL::timestamptz AS delivered_at, q.lane, event_subject(e.event_key) AS subject
FROM delivery_queue q
JOIN destinations d ON d.id = q.destination_id
JOIN delivery_events e ON e.id = q.event_id AND e.day = q.event_day AND e.lane = q.lane;

CREATE VIEW deliveries_done AS
SELECT l.event_id AS id, l.destination_id, e.event_key,
       'wh_' || left(encode(sha256(convert_to(d.name || '/' || e.event_key, 'UTF8')), 'hex'), 32) AS webhook_id,
       e.kind, e.conversation,
       convert_from(CASE WHEN d.format = 'meta' THEN e.meta_body ELSE e.body END, 'UTF8')::jsonb AS envelope,
       'delivered'::text AS state, l.attempt AS attempts, l.at AS next_attempt_at, l.received_at,
       NULL::timestamptz AS window_start, l.status::integer AS last_status, l.error AS last_error,
       l.at AS delivered_at, l.lane, event_subject(e.event_key) AS subject
FROM delivery_log l
JOIN destinations d ON d.id = l.destination_id
-- (received_at: the log's index reaches a delivered attempt from its event)
JOIN delivery_events e ON e.id = l.event_id AND e.day = l.event_day AND e.lane = l.lane
                      AND e.received_at = l.received_at
WHERE l.outcome = 'delivered'
  AND NOT EXISTS (SELECT 1 FROM delivery_queue q
                  WHERE q.destination_id = l.destination_id AND q.event_id = l.event_id
                    AND q.lane = l.lane)
  AND NOT EXISTS (SELECT 1 FROM delivery_log n
                  WHERE n.destination_id = l.destination_id AND n.lane = l.lane AND n.outcome = 'delivered'
                    AND n.received_at = l.received_at AND n.event_id = l.event_id
                    AND (n.at, n.day) > (l.at, l.day));

CREATE OR REPLACE VIEW deliveries AS
SELECT * FROM deliveries_open
UNION ALL
SELECT * FROM deliveries_done;
