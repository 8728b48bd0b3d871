-- Queries of the load-test harness (loadtest/): run bookkeeping and exactly-once verification.
-- Every query is scoped to rows staged after the run started (id > $1).

-- name: lt_inbox_max_id
SELECT coalesce(max(id), 0) FROM webhook_inbox;

-- name: lt_inbox_digests
-- Each distinct stored body of the run, by SHA-256, with how many rows hold it.
SELECT sha256(body) AS digest, count(*) AS n FROM webhook_inbox WHERE id > $1 GROUP BY 1;

-- name: lt_inbox_backlog
-- Webhooks of the run not processed yet: unread by the lanes' cursors, or moved aside and
-- waiting for a retry.
SELECT count(*) AS pending,
       coalesce(extract(epoch FROM clock_timestamp() - min(received_at)), 0)::float8 AS lag_s
FROM inbox_unprocessed()
WHERE id > $1 AND state = 'pending';

-- name: lt_inbox_states
SELECT state, count(*) AS n FROM inbox_row_states() WHERE id > $1 GROUP BY state;

-- name: lt_on_citus
SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus');

-- name: lt_parked_retrying
-- Webhooks of the run moved aside and waiting for a retry (the drain on Citus).
SELECT count(*) FROM inbox_parked WHERE inbox_id > $1 AND state = 'retry';

-- name: lt_parked_states
-- On Citus: the run's webhooks moved aside, by state ('retry', 'dead').
SELECT state::text, count(*) AS n FROM inbox_parked WHERE inbox_id > $1 GROUP BY state;

-- name: lt_table_columns
SELECT column_name::text FROM information_schema.columns
WHERE table_schema = current_schema() AND table_name = $1;

-- name: lt_processed_keys_since
SELECT event_key FROM processed_webhook_events WHERE inbox_id > $1;

-- name: lt_processed_keys_among
SELECT event_key FROM processed_webhook_events WHERE event_key = ANY($1::text[]);

-- name: lt_inbound_counts
SELECT wamid, count(*) AS n FROM inbound_messages WHERE wamid = ANY($1::text[]) GROUP BY wamid;

-- name: lt_status_counts
SELECT wamid, count(*) AS n FROM message_statuses WHERE wamid = ANY($1::text[]) GROUP BY wamid;

-- name: lt_e2e_latency
-- Receipt (row staged) to processed (key and side effects committed), per event, in seconds.
SELECT count(*) AS n,
       percentile_cont(ARRAY[0.5, 0.9, 0.99, 0.999]) WITHIN GROUP (ORDER BY d) AS ps,
       max(d) AS mx
FROM (SELECT extract(epoch FROM p.processed_at - i.received_at)::float8 AS d
      FROM processed_webhook_events p JOIN webhook_inbox i ON i.id = p.inbox_id
      WHERE p.inbox_id > $1) AS t;

-- name: lt_e2e_timeline
-- p50/p99 receipt-to-processed latency per second of receipt, seconds from $2.
SELECT floor(extract(epoch FROM i.received_at - $2::timestamptz))::int AS t,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM p.processed_at - i.received_at)) AS p50,
       percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM p.processed_at - i.received_at)) AS p99
FROM processed_webhook_events p JOIN webhook_inbox i ON i.id = p.inbox_id
WHERE p.inbox_id > $1
GROUP BY 1 ORDER BY 1;

-- name: lt_inbox_insert_one
-- One row in its own transaction: the insert-per-request baseline's path.
INSERT INTO webhook_inbox (source, body, delivery_id) VALUES ($1, $2, $3) RETURNING id;

-- name: lt_outbox_enqueue_bulk
-- Load tests: many rows in one statement (same shape as outbox_enqueue).
INSERT INTO outbox (tenant, idem_key, callback_data, provider, phone_number_id, recipient, payload, unknown_policy)
SELECT $1, k, $1 || ':' || k, $2, $3, r, $4, 'review'
FROM unnest($5::text[], $6::text[]) AS t(k, r)
ON CONFLICT (tenant, idem_key) DO NOTHING;

-- name: lt_outbox_unsent
SELECT count(*) FROM outbox WHERE state IN ('pending', 'sending');

-- name: lt_outbox_open
-- Sends not settled yet: unknown ones wait for their status webhook (or the reconciler).
SELECT count(*) FROM outbox WHERE state IN ('pending', 'sending', 'unknown');

-- name: lt_outbox_states_all
SELECT callback_data, state FROM outbox;

-- name: lt_old_partition
-- Chaos: a partition $2 days back (far behind every horizon: the next pass drops it).
SELECT partition_ensure_day($1, current_date - $2::int);

-- name: lt_old_partitions_left
-- Chaos: partitions of any table at least $1 days back.
SELECT count(*) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE c.relname ~ '_p[0-9]{8}$' AND to_date(right(c.relname, 8), 'YYYYMMDD') <= current_date - $1::int;

-- name: lt_dead_items
-- Chaos: every dead item of the run, with the digest of the body it came from.
SELECT sha256(w.body) AS digest, d.kind, d.state
FROM dead_events d JOIN webhook_inbox w ON w.id = d.inbox_id
WHERE d.inbox_id > $1;

-- name: lt_dead_items_retrying
SELECT count(*) FROM dead_events WHERE inbox_id > $1 AND state = 'retry';

-- name: pipeline_segments
-- bench-pipeline: the times the database keeps of each event and delivery of $1 (event keys):
-- its webhook row's INSERT, its dedup key's, its delivery's (queued in the key's transaction:
-- the same time) (Unix seconds); one row per destination that got it.
SELECT p.event_key, d.name,
       extract(epoch FROM w.received_at)::float8 AS stored,
       extract(epoch FROM p.processed_at)::float8 AS keyed,
       extract(epoch FROM p.processed_at)::float8 AS queued
FROM processed_webhook_events p
JOIN webhook_inbox w ON w.id = p.inbox_id
JOIN delivery_events e ON e.event_key = p.event_key
JOIN destinations d
  ON EXISTS (SELECT 1 FROM delivery_log l
             WHERE l.destination_id = d.id AND l.outcome = 'delivered'
               AND l.received_at = e.received_at AND l.event_id = e.id)
  OR EXISTS (SELECT 1 FROM delivery_queue q WHERE q.destination_id = d.id AND q.event_id = e.id)
WHERE p.event_key = ANY($1::text[]);

-- name: drain_left
-- Whether any staged webhook is not processed yet: unread by the lanes' cursors, or moved
-- aside and waiting for a retry.
SELECT (inbox_oldest_unread() IS NOT NULL
        OR EXISTS (SELECT 1 FROM inbox_parked WHERE state = 'retry'))::int;

-- name: pipeline_open_work
-- bench-pipeline: what the pipeline has not finished: staged rows not processed, deliveries
-- not yet delivered (or given up).
SELECT (SELECT count(*) FROM webhook_inbox WHERE state = 'pending') AS pending,
       (SELECT count(*) FROM deliveries WHERE state IN ('pending', 'delivering')) AS undelivered;

-- name: lt_outbox_enqueue_ordered
-- Load tests: many rows in one statement, their ids in the order given (the arrival order);
-- each key with the time of its insert (epoch seconds).
INSERT INTO outbox (tenant, idem_key, callback_data, provider, phone_number_id, recipient, payload, unknown_policy)
SELECT $1, t.k, $1 || ':' || t.k, $2, $3, t.r, $4, 'review'
FROM unnest($5::text[], $6::text[]) WITH ORDINALITY AS t(k, r, n)
ORDER BY t.n
RETURNING idem_key, extract(epoch FROM created_at)::float8 AS at;

-- name: lt_outbox_unsent_number
SELECT count(*) FROM outbox WHERE state IN ('pending', 'sending') AND phone_number_id = $1;

-- name: lt_outbox_accepted_number
SELECT count(*) FROM outbox WHERE state = 'accepted' AND phone_number_id = $1;

-- name: lt_listeners
-- Sessions with this application_name: a LISTEN session names itself after its channel
-- (gateway.store.listen.LISTENER_NAME); the query column only shows its last statement.
SELECT count(*) FROM pg_stat_activity WHERE application_name = $1;
