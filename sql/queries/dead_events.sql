-- dead_events: events (or malformed fragments) that failed on their own, their retries and
-- the operator's list/show/replay; event_fragments: exact bytes of events stored escaped.

-- name: dead_events_record
-- New items from one consumer transaction; received_at comes from their inbox row.
-- $1 inbox ids, $2 positions, $3 paths, $4 keys, $5 kinds, $6 sources, $7 units,
-- $8 contexts (JSON text), $9 fragments, $10 states, $11 attempts, $12 deferrals,
-- $13 seconds until due, $14 errors.
INSERT INTO dead_events
    (inbox_id, position, path, event_key, kind, source, received_at, unit, context, fragment,
     state, attempts, deferrals, next_attempt_at, last_error)
SELECT t.inbox_id, t.position, t.path, t.key, t.kind, t.source,
       coalesce(w.received_at, clock_timestamp()), t.unit, t.context::jsonb, t.fragment,
       t.state, t.attempts, t.deferrals, clock_timestamp() + make_interval(secs => t.delay), t.error
FROM unnest($1::bigint[], $2::int[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[],
            $8::text[], $9::bytea[], $10::text[], $11::int[], $12::int[], $13::float8[], $14::text[])
     AS t(inbox_id, position, path, key, kind, source, unit, context, fragment, state, attempts,
          deferrals, delay, error)
LEFT JOIN webhook_inbox w ON w.id = t.inbox_id
ON CONFLICT (inbox_id, path, md5(coalesce(event_key, ''))) DO NOTHING;

-- name: dead_events_claim
-- Due items, locked for this transaction; other consumers skip them.
SELECT id, inbox_id, position, path, event_key, kind, source, unit, context, fragment,
       attempts, deferrals
FROM dead_events
WHERE state = 'retry' AND next_attempt_at <= clock_timestamp()
ORDER BY next_attempt_at, id
LIMIT $1
FOR UPDATE SKIP LOCKED;

-- name: dead_events_due
-- Whether any item is due, without a lock (on Citus dead_events is a reference table: a FOR
-- UPDATE there locks it on every node for the transaction, even when it finds nothing, so
-- consumers look first).
SELECT EXISTS (SELECT 1 FROM dead_events WHERE state = 'retry' AND next_attempt_at <= clock_timestamp());

-- name: dead_events_failed
-- A retry failed: $2 new state (retry/dead), $3/$4 attempts/deferrals to add, $5 delay, $6 error.
-- (The clock is read in a sub-select, here and below: Citus refuses volatile functions in an
-- UPDATE of a distributed or reference table.)
UPDATE dead_events d SET
    state = $2,
    attempts = d.attempts + $3,
    deferrals = d.deferrals + $4,
    next_attempt_at = c.due,
    last_error = $6,
    updated_at = c.now
FROM (SELECT clock_timestamp() AS now, clock_timestamp() + make_interval(secs => $5) AS due) c
WHERE d.id = $1;

-- name: dead_events_done
UPDATE dead_events d SET state = 'done', updated_at = c.now
FROM (SELECT clock_timestamp() AS now) c
WHERE d.id = ANY($1::bigint[]);

-- name: dead_events_list
-- $1 states, $2 since, $3 until (received_at; NULL: open), $4 limit.
SELECT id, inbox_id, path, event_key, kind, source, state, attempts, deferrals,
       received_at, next_attempt_at, octet_length(fragment) AS bytes, last_error
FROM dead_events
WHERE state = ANY($1::text[])
  AND ($2::timestamptz IS NULL OR received_at >= $2)
  AND ($3::timestamptz IS NULL OR received_at < $3)
ORDER BY id
LIMIT $4;

-- name: dead_events_count
SELECT count(*) FROM dead_events
WHERE state = ANY($1::text[])
  AND ($2::timestamptz IS NULL OR received_at >= $2)
  AND ($3::timestamptz IS NULL OR received_at < $3);

-- name: dead_events_get
SELECT id, inbox_id, position, path, event_key, kind, source, unit, context, fragment, state,
       attempts, deferrals, received_at, next_attempt_at, created_at, updated_at, last_error
FROM dead_events WHERE id = $1;

-- name: dead_events_replay
-- Dead items due again with a fresh budget: $1 ids (NULL: any), $2 since, $3 until.
UPDATE dead_events d SET state = 'retry', attempts = 0, deferrals = 0,
       next_attempt_at = c.now, updated_at = c.now
FROM (SELECT clock_timestamp() AS now) c
WHERE d.state = 'dead'
  AND ($1::bigint[] IS NULL OR d.id = ANY($1::bigint[]))
  AND ($2::timestamptz IS NULL OR d.received_at >= $2)
  AND ($3::timestamptz IS NULL OR d.received_at < $3)
RETURNING d.id;

-- name: dead_events_stats
-- Items by state, and the age of the oldest one waiting for a retry (0: none).
SELECT count(*) FILTER (WHERE state = 'retry') AS retry,
       count(*) FILTER (WHERE state = 'dead') AS dead,
       coalesce(extract(epoch FROM clock_timestamp() - min(received_at) FILTER (WHERE state = 'retry')), 0)::float8
           AS oldest_retry_s
FROM dead_events WHERE state <> 'done';

-- name: event_fragments_record
-- Exact bytes of events stored escaped, for the keys this transaction processed
-- ($1 keys, $2 inbox ids, $3 paths, $4 fragments); a duplicate's key belongs to another row.
INSERT INTO event_fragments (event_key, inbox_id, path, fragment, subject)
SELECT DISTINCT ON (t.key) t.key, t.inbox_id, t.path, t.fragment, p.subject
FROM unnest($1::text[], $2::bigint[], $3::text[], $4::bytea[]) AS t(key, inbox_id, path, fragment)
JOIN processed_webhook_events p ON p.event_key = t.key AND p.inbox_id = t.inbox_id
ORDER BY t.key
ON CONFLICT (event_key, subject) DO NOTHING;
