-- What the operator console reads. Every list is keyset-paginated on an index: a page is one
-- range scan from its cursor, however large the table. Filters that no index orders are
-- applied to a bounded scan (at most $scan rows), and the page says how far it looked.
-- Open bounds come as -infinity/infinity and the largest id, never as NULL, so that a
-- generic plan still uses them as index conditions.

-- name: console_dead_rows
-- Whole webhooks parked dead (not JSON, or failing on their own), newest id first, on
-- inbox_parked's primary key; $1 before id, $2/$3 received in [since, until), $4 limit.
SELECT inbox_id AS id, source, received_at, delivery_id, attempts, octet_length(body) AS bytes, last_error
FROM inbox_parked
WHERE state = 'dead' AND inbox_id < $1 AND received_at >= $2 AND received_at < $3
ORDER BY inbox_id DESC
LIMIT $4;

-- name: console_dead_items
-- Dead events (or waiting for a retry: $1 state), newest first, on dead_events_open;
-- $2/$3 received in [since, until), ($4, $5) the cursor, $6 limit.
SELECT id, inbox_id, path, event_key, kind, source, state, attempts, deferrals, received_at,
       next_attempt_at, octet_length(fragment) AS bytes, last_error
FROM dead_events
WHERE state = $1 AND state <> 'done' AND received_at >= $2 AND received_at < $3
  AND (received_at, id) < ($4, $5)
ORDER BY received_at DESC, id DESC
LIMIT $6;

-- name: console_dead_items_kind
-- As console_dead_items, of one kind ($7), on dead_events_open_kind.
SELECT id, inbox_id, path, event_key, kind, source, state, attempts, deferrals, received_at,
       next_attempt_at, octet_length(fragment) AS bytes, last_error
FROM dead_events
WHERE state = $1 AND state <> 'done' AND kind = $7 AND received_at >= $2 AND received_at < $3
  AND (received_at, id) < ($4, $5)
ORDER BY received_at DESC, id DESC
LIMIT $6;

-- name: console_dead_count
-- What a replay of a range would touch, each counted up to $3: dead rows and dead events
-- received in [$1, $2).
SELECT (SELECT count(*) FROM (SELECT FROM inbox_parked
                              WHERE state = 'dead' AND received_at >= $1 AND received_at < $2
                              LIMIT $3) r) AS rows,
       (SELECT count(*) FROM (SELECT FROM dead_events
                              WHERE state = 'dead' AND state <> 'done' AND received_at >= $1
                                AND received_at < $2
                              LIMIT $3) e) AS items;

-- name: console_outbox_by_key
-- Rows with key $1 of any tenant: the tenants are walked on (tenant, idem_key) one probe
-- each (a loose index scan), and each probed for the key.
WITH RECURSIVE t AS (
    (SELECT tenant FROM outbox ORDER BY tenant LIMIT 1)
    UNION ALL
    SELECT (SELECT o.tenant FROM outbox o WHERE o.tenant > t.tenant ORDER BY o.tenant LIMIT 1)
    FROM t WHERE t.tenant IS NOT NULL
)
SELECT o.id, o.tenant, o.idem_key, o.state, o.provider, o.phone_number_id, o.recipient, o.attempts,
       o.wamid, o.delivery_status, o.last_error_code, o.last_error, o.updated_at
FROM t JOIN outbox o ON o.tenant = t.tenant AND o.idem_key = $1
ORDER BY o.id DESC;

-- name: console_outbox_by_wamid
SELECT id, tenant, idem_key, state, provider, phone_number_id, recipient, attempts, wamid,
       delivery_status, last_error_code, last_error, updated_at
FROM outbox WHERE wamid = $1
ORDER BY id DESC;

-- name: console_outbox_scan
-- Newest first from before id $1: at most $2 rows scanned on the primary key, those of
-- tenant $3 and state $4 (NULL: any) kept, $5 at most. With no match the single row has a
-- NULL id and says how many rows were scanned down to which id.
WITH scan AS (
    SELECT id, tenant, idem_key, state, provider, phone_number_id, recipient, attempts, wamid,
           delivery_status, last_error_code, last_error, updated_at
    FROM outbox WHERE id < $1 ORDER BY id DESC LIMIT $2
), hit AS (
    SELECT * FROM scan WHERE ($3::text IS NULL OR tenant = $3) AND ($4::text IS NULL OR state = $4)
    ORDER BY id DESC LIMIT $5
)
SELECT h.*, s.scanned, s.scanned_to
FROM (SELECT count(*) AS scanned, min(id) AS scanned_to FROM scan) s LEFT JOIN hit h ON true
ORDER BY h.id DESC;

-- name: console_customer_ids
-- Every identity of the customer named $1 (a phone number, a BSUID or a parent BSUID) as the
-- consumers saw them together (customer_ids): the business numbers are walked one probe each
-- on the primary key (a loose index scan), each probed by BSUID, by phone and by parent BSUID.
WITH RECURSIVE n AS (
    (SELECT phone_number_id FROM customer_ids ORDER BY phone_number_id LIMIT 1)
    UNION ALL
    SELECT (SELECT c.phone_number_id FROM customer_ids c WHERE c.phone_number_id > n.phone_number_id
            ORDER BY c.phone_number_id LIMIT 1)
    FROM n WHERE n.phone_number_id IS NOT NULL
), found AS (
    SELECT c.wa_id, c.user_id, c.parent_user_id FROM n
    JOIN customer_ids c ON c.phone_number_id = n.phone_number_id AND c.user_id = $1
    UNION
    SELECT c.wa_id, c.user_id, c.parent_user_id FROM n
    JOIN customer_ids c ON c.phone_number_id = n.phone_number_id AND c.wa_id = $1
    UNION
    SELECT c.wa_id, c.user_id, c.parent_user_id FROM n
    JOIN customer_ids c ON c.phone_number_id = n.phone_number_id AND c.parent_user_id = $1
)
SELECT DISTINCT x FROM (
    SELECT $1::text AS x
    UNION ALL SELECT wa_id FROM found UNION ALL SELECT user_id FROM found
    UNION ALL SELECT parent_user_id FROM found
) ids WHERE x IS NOT NULL
LIMIT 50;

-- name: console_outbox_scan_recipient
-- As console_outbox_scan, among the rows to any of the recipients $6 (one person's phone and
-- BSUIDs), each read newest first on outbox_recipient.
WITH scan AS (
    SELECT o.* FROM unnest($6::text[]) AS r(recipient)
    CROSS JOIN LATERAL (
        SELECT id, tenant, idem_key, state, provider, phone_number_id, recipient, attempts, wamid,
               delivery_status, last_error_code, last_error, updated_at
        FROM outbox WHERE recipient = r.recipient AND id < $1 ORDER BY id DESC LIMIT $2) o
    ORDER BY o.id DESC LIMIT $2
), hit AS (
    SELECT * FROM scan WHERE ($3::text IS NULL OR tenant = $3) AND ($4::text IS NULL OR state = $4)
    ORDER BY id DESC LIMIT $5
)
SELECT h.*, s.scanned, s.scanned_to
FROM (SELECT count(*) AS scanned, min(id) AS scanned_to FROM scan) s LEFT JOIN hit h ON true
ORDER BY h.id DESC;

-- name: console_outbox_scan_attention
-- As console_outbox_scan, among the rows in state $6 (unknown, review, failed or cancelled),
-- on outbox_attention.
WITH scan AS (
    SELECT id, tenant, idem_key, state, provider, phone_number_id, recipient, attempts, wamid,
           delivery_status, last_error_code, last_error, updated_at
    FROM outbox
    WHERE state = $6 AND state IN ('unknown', 'review', 'failed', 'cancelled') AND id < $1
    ORDER BY id DESC LIMIT $2
), hit AS (
    SELECT * FROM scan WHERE ($3::text IS NULL OR tenant = $3) AND ($4::text IS NULL OR state = $4)
    ORDER BY id DESC LIMIT $5
)
SELECT h.*, s.scanned, s.scanned_to
FROM (SELECT count(*) AS scanned, min(id) AS scanned_to FROM scan) s LEFT JOIN hit h ON true
ORDER BY h.id DESC;

-- name: console_outbox_bulk_count
-- What a bulk release/cancel of state $1 changed in [$2, $3) of tenant $4 would select,
-- counted up to $5.
SELECT count(*) FROM (
    SELECT FROM outbox
    WHERE state = $1 AND state IN ('unknown', 'review', 'failed', 'cancelled', 'pending')
      AND ($2::float8 IS NULL OR updated_at >= to_timestamp($2::float8))
      AND ($3::float8 IS NULL OR updated_at < to_timestamp($3::float8))
      AND ($4::text IS NULL OR tenant = $4)
    LIMIT $5) x;

-- name: console_statuses
-- A sent message's statuses in the order they happened (then as they arrived).
SELECT status, participant, recipient, timestamp, errors, recorded_at, source
FROM message_statuses WHERE wamid = $1
ORDER BY timestamp NULLS LAST, recorded_at, id
LIMIT 200;

-- name: console_attempts
-- A send's attempts in order, and what operators did to it.
SELECT 'attempt' AS what, a.at, a.sent_at, a.outcome AS detail, a.code, a.error, a.wamid
FROM outbox_attempts a WHERE a.outbox_id = $1
UNION ALL
SELECT 'operator', x.at, NULL, x.actor || ' (' || x.via || '): ' || x.action, NULL, x.outcome, NULL
FROM operator_actions x WHERE x.target IN ($2, $3)
ORDER BY 2
LIMIT 200;

-- name: console_destinations
-- Every destination with its breaker (its backlog and failures: console_destination_counts).
SELECT d.id, d.due_from, d.name, d.url, d.events, d.secret, d.enabled, d.ordered, d.max_in_flight,
       d.breaker_state, d.consecutive_failures, d.breaker_changed_at,
       CASE WHEN d.previous_secret_until > clock_timestamp() THEN d.previous_secret END AS previous_secret,
       CASE WHEN d.previous_secret_until > clock_timestamp() THEN d.previous_secret_until END
           AS previous_secret_until
FROM destinations d
ORDER BY d.name;

-- name: console_destination_counts
-- One destination's ($1 its id, $2 its due_from) backlog and failures, each counted up to $3 on
-- its index (delivery_queue_due from due_from, delivery_queue_failed). One statement per
-- destination, as deliveries_gauge: on a Citus cluster a subquery over the queue's shards
-- cannot refer to a destination's row.
SELECT (SELECT count(*) FROM (SELECT 1 FROM delivery_queue x
                              WHERE x.destination_id = $1 AND NOT x.failed AND x.due >= $2
                              LIMIT $3) c) AS backlog,
       (SELECT count(*) FROM (SELECT 1 FROM delivery_queue x
                              WHERE x.destination_id = $1 AND x.failed LIMIT $3) c) AS failed;

-- name: console_deliveries_failed
-- One destination ($1 id) failed deliveries, newest first, on delivery_queue_failed; received
-- from $2, before the cursor ($3, $4) (the range's end is one too: gateway/store/console.py), $5
-- limit. One upper bound: with two (a time and a row), the index scan of a day partition started
-- at the wrong one and read all of it. Their events are read next (console_delivery_events): a
-- join would let the planner hash every event of the table, and Citus refuses a lateral probe.
SELECT q.event_id AS id, q.event_day, q.lane, 'failed' AS state, q.attempts, q.received_at,
       q.due AS next_attempt_at, q.last_status::integer AS last_status, q.last_error,
       NULL::timestamptz AS delivered_at
FROM delivery_queue q
WHERE q.destination_id = $1 AND q.failed AND q.received_at >= $2
  AND (q.received_at, q.event_id) < ($3, $4)
ORDER BY q.received_at DESC, q.event_id DESC
LIMIT $5;

-- name: console_deliveries
-- One destination's deliveries ($1 id), newest first: the open ones on delivery_queue_received,
-- the delivered ones on delivery_log_delivered (each delivered attempt of a delivery that is not
-- open again: one replayed and delivered again shows twice), merged; at most $6 scanned from $2
-- up to the cursor ($3, $4) (as console_deliveries_failed), those in state $7 (NULL: any) kept,
-- $5 at most. A state names one of the two only: the other is not read. Whether a delivered one
-- is open again is asked of the rows the scan took (a probe each, on the lane: one shard on
-- Citus), never as a join: the planner would hash the queue against every delivered row of the
-- destination. Their events are read next (console_delivery_events).
WITH scan AS (
    SELECT * FROM (
        (SELECT q.event_id AS id, q.event_day, q.lane,
                CASE WHEN q.failed THEN 'failed' ELSE 'pending' END AS state, q.attempts, q.received_at,
                q.due AS next_attempt_at, q.last_status::integer AS last_status, q.last_error,
                NULL::timestamptz AS delivered_at
         FROM delivery_queue q
         WHERE ($7::text IS NULL OR $7 <> 'delivered')
           AND q.destination_id = $1 AND q.received_at >= $2 AND (q.received_at, q.event_id) < ($3, $4)
         ORDER BY q.received_at DESC, q.event_id DESC
         LIMIT $6)
        UNION ALL
        (SELECT l.event_id, l.event_day, l.lane,
                -- (a probe, never hashed: LIMIT keeps it a probe of the rows the scan takes)
                CASE WHEN (SELECT true FROM delivery_queue q
                           WHERE q.destination_id = $1 AND q.event_id = l.event_id AND q.lane = l.lane
                           LIMIT 1)
                     THEN 'reopened' ELSE 'delivered' END,
                l.attempt, l.received_at, l.at, l.status::integer, l.error, l.at
         FROM delivery_log l
         WHERE ($7::text IS NULL OR $7 = 'delivered')
           AND l.destination_id = $1 AND l.outcome = 'delivered'
           AND l.received_at >= $2 AND (l.received_at, l.event_id) < ($3, $4)
         ORDER BY l.received_at DESC, l.event_id DESC
         LIMIT $6)
    ) u
    ORDER BY received_at DESC, id DESC
    LIMIT $6
), hit AS (
    SELECT * FROM scan WHERE state <> 'reopened' AND ($7::text IS NULL OR state = $7)
    ORDER BY received_at DESC, id DESC LIMIT $5
), last AS (
    SELECT received_at, id FROM scan ORDER BY received_at, id LIMIT 1
)
SELECT h.*, (SELECT count(*) FROM scan) AS scanned, l.received_at AS scanned_at, l.id AS scanned_id
FROM (SELECT 1) one LEFT JOIN last l ON true LEFT JOIN hit h ON true
ORDER BY h.received_at DESC, h.id DESC;

-- name: console_delivery_events
-- The events of a page of deliveries: $1 ids, $2 days, $3 lanes (in step), with their webhook
-- ids at destination $4 (its name). Matched on all three by the caller: each array prunes on
-- its own (day partitions; shards by lane on Citus).
SELECT e.id, e.day, e.lane, e.event_key, e.kind, delivery_webhook_id($4, e.event_key) AS webhook_id
FROM delivery_events e
WHERE e.id = ANY($1::bigint[]) AND e.day = ANY($2::date[]) AND e.lane = ANY($3::integer[]);

-- name: console_deliveries_count
-- What a replay of destination $1's deliveries in state $2 (failed or delivered) received in
-- [$3, $4) touches, counted up to $5 ($1 NULL: every destination), per destination on its
-- index: failed ones in the queue, delivered attempts in the log (a delivery delivered twice,
-- after a replay, counts twice: at most this many).
SELECT count(*) FROM (
    (SELECT FROM destinations d
     CROSS JOIN LATERAL (SELECT FROM delivery_queue q
                         WHERE q.destination_id = d.id AND q.failed
                           AND q.received_at >= $3 AND q.received_at < $4
                         LIMIT $5) x
     WHERE $2 = 'failed' AND ($1::text IS NULL OR d.name = $1)
     LIMIT $5)
    UNION ALL
    (SELECT FROM destinations d
     CROSS JOIN LATERAL (SELECT FROM delivery_log l
                         WHERE l.destination_id = d.id AND l.outcome = 'delivered'
                           AND l.received_at >= $3 AND l.received_at < $4
                         LIMIT $5) x
     WHERE $2 = 'delivered' AND ($1::text IS NULL OR d.name = $1)
     LIMIT $5)
) x;

-- name: console_inbound_by_wamid
SELECT id, wamid, source, phone_number_id, sender, user_id, type, timestamp, contact_name, message,
       inbox_id, received_at
FROM inbound_messages WHERE wamid = $1
ORDER BY id DESC
LIMIT 20;

-- name: console_inbound_scan
-- Newest first from before id $1: at most $2 messages scanned, those from the customer's
-- identities $3 (phone numbers or BSUIDs; NULL: any) kept, $4 at most; the single row of no
-- match says how far the scan went.
WITH scan AS (
    SELECT id, wamid, source, phone_number_id, sender, user_id, type, timestamp, contact_name, received_at
    FROM inbound_messages WHERE id < $1 ORDER BY id DESC LIMIT $2
), hit AS (
    SELECT * FROM scan
    WHERE $3::text[] IS NULL OR sender = ANY($3::text[]) OR user_id = ANY($3::text[])
    ORDER BY id DESC LIMIT $4
)
SELECT h.*, s.scanned, s.scanned_to
FROM (SELECT count(*) AS scanned, min(id) AS scanned_to FROM scan) s LEFT JOIN hit h ON true
ORDER BY h.id DESC;

-- name: console_event_story
-- What the gateway did with one event key ($1) of an inbound message received in inbox row
-- $2, its deliveries aside (console_event_deliveries): its dedup key, the events of it that
-- failed on their own.
SELECT 'key' AS what, p.event_key AS name, NULL::text AS state, p.processed_at AS at, NULL::text AS detail
FROM processed_webhook_events p WHERE p.event_key = $1
UNION ALL
SELECT 'dead', 'E' || e.id, e.state, e.updated_at, e.last_error
FROM dead_events e WHERE e.inbox_id = $2 AND coalesce(e.event_key, '') IN ($1, '');

-- name: console_event_deliveries
-- The deliveries of event key $1: per event row and destination, the queued one and each
-- delivered attempt (the caller keeps the queued one, else the last delivered). Joined on the
-- lane: one shard's query per lane on Citus.
SELECT e.id AS event_id, d.name, CASE WHEN q.failed THEN 'failed' ELSE 'pending' END AS state,
       q.due AS at, coalesce(q.last_status::text || ' ', '') || coalesce(q.last_error, '') AS detail
FROM delivery_events e
CROSS JOIN destinations d
JOIN delivery_queue q ON q.destination_id = d.id AND q.event_id = e.id AND q.lane = e.lane
WHERE e.event_key = $1
UNION ALL
SELECT e.id, d.name, 'delivered', l.at, coalesce(l.status::text || ' ', '') || coalesce(l.error, '')
FROM delivery_events e
CROSS JOIN destinations d
JOIN delivery_log l ON l.destination_id = d.id AND l.outcome = 'delivered'
                   AND l.received_at = e.received_at AND l.event_id = e.id AND l.lane = e.lane
WHERE e.event_key = $1;

-- name: console_replies
-- The replies claimed for an inbound message, with their outbox rows. The claims are read
-- first (on Citus they live on the wamid's shard, the outbox on one of its own).
WITH c AS MATERIALIZED (
    SELECT claimed_by, claimed_at, tenant, idem_key FROM reply_claims WHERE inbound_wamid = $1
)
SELECT c.claimed_by, c.claimed_at, c.tenant, c.idem_key, o.state, o.wamid, o.delivery_status
FROM c
LEFT JOIN outbox o ON o.tenant = c.tenant AND o.idem_key = c.idem_key
ORDER BY c.claimed_at;

-- name: console_overview
-- The overview's numbers, every count bounded by $1 on a partial index; the ingest rate
-- counts the rows received in the last minute among the newest $2 ids. (Each bounded count
-- selects a column: Citus fails to plan a subquery with none over a distributed table's shards,
-- "a column definition list is required". The partitions' horizon is console_partitions_ahead.)
SELECT
    (SELECT count(*) FROM (SELECT 1 FROM webhook_inbox
                           WHERE received_at >= now() - interval '60 seconds'
                             AND id > (SELECT max(id) FROM webhook_inbox) - $2
                           LIMIT $2) x) AS ingest_last_minute,
    inbox_pending_count($1) AS inbox_pending,
    (SELECT coalesce(extract(epoch FROM clock_timestamp() - least(
                inbox_oldest_unread(),
                (SELECT min(next_attempt_at) FROM inbox_parked
                 WHERE state = 'retry' AND next_attempt_at <= clock_timestamp()))), 0)::float8)
        AS inbox_oldest_due_s,
    (SELECT count(*) FROM (SELECT 1 FROM inbox_parked WHERE state = 'dead' LIMIT $1) x) AS dead_rows,
    (SELECT count(*) FROM (SELECT 1 FROM dead_events WHERE state = 'dead' AND state <> 'done' LIMIT $1) x)
        AS dead_events,
    (SELECT count(*) FROM (SELECT 1 FROM dead_events WHERE state = 'retry' AND state <> 'done' LIMIT $1) x)
        AS retry_events,
    (SELECT min(received_at) FROM (SELECT received_at FROM dead_events
                                   WHERE state = 'dead' AND state <> 'done'
                                   ORDER BY received_at LIMIT 1) x) AS dead_oldest,
    (SELECT count(*) FROM (SELECT 1 FROM outbox WHERE state = 'pending' LIMIT $1) x) AS outbox_pending,
    (SELECT min(next_attempt_at) FROM (SELECT next_attempt_at FROM outbox WHERE state = 'pending'
                                       ORDER BY next_attempt_at LIMIT 1) x) AS outbox_next_due,
    (SELECT count(*) FROM (SELECT 1 FROM outbox WHERE state = 'sending' LIMIT $1) x) AS outbox_sending,
    (SELECT count(*) FROM (SELECT 1 FROM outbox
                           WHERE state = 'unknown' AND state IN ('unknown', 'review', 'failed', 'cancelled')
                           LIMIT $1) x) AS outbox_unknown,
    (SELECT min(unknown_at) FROM outbox WHERE state = 'unknown') AS outbox_oldest_unknown,
    (SELECT count(*) FROM (SELECT 1 FROM outbox
                           WHERE state = 'review' AND state IN ('unknown', 'review', 'failed', 'cancelled')
                           LIMIT $1) x) AS outbox_review,
    (SELECT count(*) FROM (SELECT 1 FROM outbox
                           WHERE state = 'failed' AND state IN ('unknown', 'review', 'failed', 'cancelled')
                           LIMIT $1) x) AS outbox_failed,
    (SELECT count(*) FROM send_breakers WHERE state <> 'closed') AS open_sender_breakers;

-- name: console_partitions_ahead
-- How many days ahead the day partitions are made, for the overview. Its own statement: on a
-- Citus coordinator a prepared statement that reads distributed tables and calls the SQL
-- function partition_days is refused ("parameterized queries for SQL functions referencing
-- distributed tables are not supported").
SELECT min(coalesce((SELECT max(pd) FROM partition_days(t) AS pd) - current_date, -1)) AS partitions_ahead_days
FROM unnest(ARRAY['processed_webhook_events', 'webhook_inbox', 'inbound_messages',
                  'message_statuses', 'account_errors', 'account_updates']) AS t
WHERE to_regclass(t) IS NOT NULL;
