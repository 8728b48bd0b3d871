-- bench-growth: fill the dedup table server-side, swap in an unpartitioned copy, measure sizes
-- and retention. Keys look like Meta status keys (random wamids: random B-tree inserts).

-- name: growth_unpartition
-- The same table as one unpartitioned heap with the same primary key (the layout before 0007).
DROP TABLE processed_webhook_events;
CREATE TABLE processed_webhook_events (
    event_key    text        NOT NULL,
    inbox_id     bigint,
    processed_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    event_day    date        NOT NULL,
    subject      text        NOT NULL,
    PRIMARY KEY (event_key, event_day, subject)
);
CREATE INDEX processed_webhook_events_processed_at ON processed_webhook_events (processed_at);

-- name: growth_fill
-- Keys $1+1 .. $2 spread over today and the 7 days before (7-day window and the slack day),
-- processed on their day. Sorted by partition and key: each chunk walks every index once
-- from left to right instead of touching a random leaf per row (with random order the fill
-- slowed down by ~4 s per million keys already stored, as every insert missed
-- shared_buffers and dirtied a page the next checkpoint had to log in full again).
INSERT INTO processed_webhook_events (event_key, inbox_id, event_day, processed_at, subject)
SELECT 'status:wamid.' || md5(n::text) || ':read:', n, current_date - (n % 8)::int,
       (current_date - (n % 8)::int) + make_interval(secs => (n % 86400)::float8), 'wamid.' || md5(n::text)
FROM generate_series($1::bigint + 1, $2::bigint) AS n
ORDER BY 3, 1;

-- name: growth_fill_day
-- $3 keys for one day ($1), numbered from $2.
INSERT INTO processed_webhook_events (event_key, inbox_id, event_day, processed_at, subject)
SELECT 'status:wamid.' || md5(n::text) || ':day:', n, $1::date, $1::date + make_interval(secs => 1),
       'wamid.' || md5(n::text)
FROM generate_series($2::bigint + 1, $2::bigint + $3::bigint) AS n
ORDER BY 1;

-- name: growth_delete_day
DELETE FROM processed_webhook_events WHERE processed_at < $1::date + 1 AND processed_at >= $1::date;

-- name: growth_bytes
-- Heap + indexes (+ TOAST) of a table and, when partitioned, all its partitions.
SELECT CASE WHEN c.relkind = 'p'
            THEN (SELECT coalesce(sum(pg_total_relation_size(t.relid)), 0) FROM pg_partition_tree(c.oid) t)
            ELSE pg_total_relation_size(c.oid) END::bigint
FROM pg_class c WHERE c.oid = $1::regclass;

-- name: growth_reset_inbox
TRUNCATE webhook_inbox, inbound_messages, message_statuses;

-- name: growth_not_done
-- Staged rows the consumers have not finished.
SELECT count(*) FROM inbox_unprocessed();
