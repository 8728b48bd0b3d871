-- Retention and partitions (maintenance job): whole day partitions are created ahead and
-- dropped when past their table's horizon; the few unpartitioned row sets are trimmed by
-- bounded DELETE batches (never one long lock); callers loop until a batch is short.
-- The partition_* functions: sql/functions/partition_*.sql.

-- name: partition_lock_timeout
-- Creating or dropping a partition locks its parent: never queue behind a long transaction
-- (and so block every writer queued behind us); the job retries on its next run. And never
-- hold those locks idle: a process stopped before its COMMIT (SIGSTOP, a paused VM) would
-- block every reader of the default partition until it came back; the server ends such a
-- transaction (and its session) after a few seconds instead.
SET LOCAL lock_timeout = '2s'; SET LOCAL idle_in_transaction_session_timeout = '5s';

-- name: partition_ensure_today
-- Today's and tomorrow's partitions (UTC) of a table a row found none in, made on the spot
-- (the job makes them ahead; ingest and consumers never depend on it having run). Whether
-- one was made.
SELECT coalesce(bool_or(partition_ensure_day($1, d::date)), false)
FROM generate_series((clock_timestamp() AT TIME ZONE 'UTC')::date,
                     (clock_timestamp() AT TIME ZONE 'UTC')::date + 1, interval '1 day') AS d;

-- name: partition_session_lock_timeout
-- The same for DETACH ... CONCURRENTLY, which runs outside a transaction (its wait for the
-- transactions that may still read the partition honours lock_timeout too).
SET lock_timeout = '2s';

-- name: partition_session_lock_timeout_reset
RESET lock_timeout;

-- name: partition_has_default
SELECT partition_has_default($1);

-- name: partition_blocker
-- A transaction holding a lock on the table (or a partition of it) for longer than $2 seconds.
SELECT pid, since FROM partition_blocker($1, make_interval(secs => $2));

-- name: partition_ensure_day
SELECT partition_ensure_day($1, $2);

-- name: partition_days
SELECT d FROM partition_days($1) AS d;

-- name: partition_oldest_before
SELECT name, detach_pending FROM partition_oldest_before($1, $2);

-- The statements below name tables, which cannot be parameters: {parent} and {child}
-- are filled in by gateway/store/retention.py with names it has checked against
-- ^[a-z_]+(_p[0-9]{8})?$ (they come from partition_oldest_before).

-- name: partition_detach
-- Outside any transaction: waits for transactions that may still read the partition, and
-- blocks no writer meanwhile.
ALTER TABLE {parent} DETACH PARTITION {child} CONCURRENTLY;

-- name: partition_detach_finalize
-- A detach that was interrupted (the connection died) is finished, not started again.
ALTER TABLE {parent} DETACH PARTITION {child} FINALIZE;

-- name: partition_drop_detached
DROP TABLE {child};

-- name: partition_detach_now
-- A parent with a default partition cannot detach concurrently: this takes its ACCESS
-- EXCLUSIVE lock for the catalog change only (the caller's lock_timeout bounds the wait, and
-- the job does not try while a long transaction holds the table).
ALTER TABLE {parent} DETACH PARTITION {child};

-- name: partition_carry_recent_keys
-- Keys of a detached day partition of processed_webhook_events processed within the dedup
-- retention ($1 days; events stamped long before they came, if any) go to the default
-- partition, where their redeliveries look for them now (found on the BRIN index).
INSERT INTO processed_webhook_events
SELECT * FROM {child} WHERE processed_at > now() - make_interval(days => $1);

-- name: maintenance_try_lock
SELECT pg_try_advisory_lock($1);

-- name: maintenance_unlock
SELECT pg_advisory_unlock($1);

-- name: inbox_carry_forward
-- Rows no lane's cursor has read yet in a partition about to be dropped (consumers far behind)
-- move to today's partition: received_at is the partition key, the id and txid stay, so the
-- cursors still read them. Found from the cursors (inbox_unread), never by scanning a whole day
-- of read rows. Whole webhooks moved aside keep their bytes in inbox_parked.
-- (The clock is read once, in a sub-select: Citus refuses a volatile function in an UPDATE of a
-- distributed table. There a moved row is numbered again by its lane, inbox_heads: a row moved
-- to another partition is inserted there, and it is still unread at its new number.)
UPDATE webhook_inbox w SET received_at = c.now
FROM (SELECT clock_timestamp() AS now) c
WHERE w.received_at < $1
  AND w.id IN (SELECT u.id FROM inbox_unread() u
               WHERE u.received_at < $1 AND NOT EXISTS (SELECT 1 FROM inbox_parked p WHERE p.inbox_id = u.id));

-- name: processed_webhook_events_purge_untimed
-- Keys with no event day (the untimed partition) and keys whose day has no partition (the
-- default one) are trimmed by age, on their processed_at indexes; day partitions are dropped.
WITH old AS (
    (SELECT event_key, event_day, subject FROM processed_webhook_events_untimed
     WHERE processed_at < now() - make_interval(days => $1) LIMIT $2)
    UNION ALL
    (SELECT event_key, event_day, subject FROM processed_webhook_events_default
     WHERE processed_at < now() - make_interval(days => $1) LIMIT $2)
)
DELETE FROM processed_webhook_events p
USING old
WHERE p.event_key = old.event_key AND p.event_day = old.event_day AND p.subject = old.subject;

-- name: reply_claims_purge
-- (No row lock in the sub-select: nothing claims a reply this old, one maintenance pass runs at
-- a time, and Citus refuses FOR UPDATE over the shards of a table it cannot route to one.)
DELETE FROM reply_claims
WHERE (inbound_wamid, claimed_by) IN (
    SELECT inbound_wamid, claimed_by FROM reply_claims
    WHERE claimed_at < now() - make_interval(days => $1)
    LIMIT $2
);

-- name: outbox_purge_terminal
-- accepted, failed and cancelled rows past the horizon (>= the send API's idempotency window).
DELETE FROM outbox
WHERE id IN (
    SELECT id FROM outbox
    WHERE state IN ('accepted', 'failed', 'cancelled')
      AND updated_at < now() - make_interval(days => $1)
    LIMIT $2
    FOR UPDATE SKIP LOCKED
);

-- name: delivery_queue_purge_orphans
-- Queued deliveries of a destination that was removed (a consumer's batch that read it before
-- the removal committed may queue some after it; nothing claims them), received before $1 days.
DELETE FROM delivery_queue
WHERE (destination_id, event_id, lane) IN (
    SELECT q.destination_id, q.event_id, q.lane FROM delivery_queue q
    WHERE q.received_at < now() - make_interval(days => $1)
      AND NOT EXISTS (SELECT 1 FROM destinations d WHERE d.id = q.destination_id)
    LIMIT $2
);

-- name: deliveries_bodies_lock
-- Session lock: no statement refers to stored bodies again (a replay of delivered deliveries,
-- sql/queries/deliveries.sql: deliveries_bodies_lock_shared) while open deliveries' bodies are
-- carried forward and old days of delivery_events dropped.
SELECT pg_advisory_lock(431198006902);

-- name: deliveries_bodies_unlock
SELECT pg_advisory_unlock(431198006902);

-- name: delivery_events_carry_forward
-- The events of open deliveries (queued: pending or failed) stored before day $1 move to
-- today's partition, and their queue rows follow, before the old days are dropped: a body
-- lives as long as a delivery needs it. Driven by the queue (small; no index on its days).
WITH moved AS (
    UPDATE delivery_events e SET day = (now() AT TIME ZONE 'UTC')::date
    FROM delivery_queue q
    WHERE e.day < $1 AND q.event_day < $1
      AND q.event_id = e.id AND q.event_day = e.day AND q.lane = e.lane
    RETURNING 1
), refs AS (
    UPDATE delivery_queue SET event_day = (now() AT TIME ZONE 'UTC')::date
    WHERE event_day < $1
    RETURNING 1
)
SELECT (SELECT count(*) FROM moved) AS events, (SELECT count(*) FROM refs) AS deliveries;

-- name: dead_events_purge_done
-- Dead items a retry or a replay finished (kept for the record, like processed inbox rows).
DELETE FROM dead_events
WHERE id IN (
    SELECT id FROM dead_events
    WHERE state = 'done' AND updated_at < now() - make_interval(days => $1)
    LIMIT $2
);

-- name: inbox_parked_purge_done
-- Whole webhooks moved aside that a retry or a replay finished (kept for the record, like the
-- log's rows).
DELETE FROM inbox_parked
WHERE inbox_id IN (
    SELECT inbox_id FROM inbox_parked
    WHERE state = 'done' AND updated_at < now() - make_interval(days => $1)
    LIMIT $2
);

-- name: event_fragments_purge
-- Exact bytes of events stored escaped, recorded before the horizon (the raw bodies' own,
-- GATEWAY_INBOX_RETENTION_DAYS), on the recorded_at index of migration 0009.
DELETE FROM event_fragments
WHERE (event_key, subject) IN (
    SELECT event_key, subject FROM event_fragments
    WHERE recorded_at < now() - make_interval(days => $1)
    LIMIT $2
);

-- name: media_purge
-- Media ids recorded before the horizon (Meta keeps media 30 days), on media_created_at.
DELETE FROM media
WHERE media_id IN (
    SELECT media_id FROM media
    WHERE created_at < now() - make_interval(days => $1)
    ORDER BY created_at
    LIMIT $2
);
