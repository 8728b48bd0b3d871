-- destinations and deliveries: forwarding to downstream HTTP endpoints (migration 0021: the
-- bodies in delivery_events, open work in delivery_queue, attempts in delivery_log). The
-- consumers' inbox_apply_batch appends events and queues their deliveries; everything else
-- about them is here. A delivery is (destination, event); its webhook id is
-- delivery_webhook_id(destination name, event key).

-- name: destination_add
INSERT INTO destinations (name, url, events, secret, max_in_flight, ordered, numbers, tenant, format)
VALUES ($1, $2, $3::text[], $4, $5, $6, $7::text[], $8, $9)
ON CONFLICT (name) DO NOTHING
RETURNING id;

-- name: destination_list
SELECT d.id, d.name, d.url, d.events, d.secret, d.enabled, d.max_in_flight, d.ordered, d.numbers, d.tenant,
       d.format,
       CASE WHEN d.previous_secret_until > clock_timestamp() THEN d.previous_secret END AS previous_secret,
       CASE WHEN d.previous_secret_until > clock_timestamp() THEN d.previous_secret_until END
           AS previous_secret_until,
       d.breaker_state, d.consecutive_failures, d.breaker_changed_at, d.created_at,
       coalesce(x.backlog, 0) AS backlog, coalesce(x.failed, 0) AS failed,
       -- disabled by a 410 Gone answer: its waiting delivery says so (until it is re-enabled)
       NOT d.enabled AND coalesce(x.gone, false) AS gone
FROM destinations d
-- (One pass over the queue grouped by destination, not a subquery per destination: a Citus
-- coordinator refuses a correlated subquery over its distributed tables.)
LEFT JOIN (
    SELECT q.destination_id, count(*) FILTER (WHERE NOT q.failed) AS backlog,
           count(*) FILTER (WHERE q.failed) AS failed,
           bool_or(NOT q.failed AND q.last_status = 410) AS gone
    FROM delivery_queue q
    GROUP BY q.destination_id
) x ON x.destination_id = d.id
ORDER BY d.name;

-- name: destination_rotate_secret
-- $2 becomes the secret; the current one stays valid (signed with too) for $3 seconds.
-- A rotation during a grace period drops the oldest: two secrets at most.
-- (The end of the grace is computed in a sub-select: a Citus coordinator refuses a volatile
-- function in an UPDATE of its tables, reference tables included.)
UPDATE destinations SET
    previous_secret = secret,
    previous_secret_until = g.until,
    secret = $2,
    updated_at = now()
FROM (SELECT clock_timestamp() + make_interval(secs => $3) AS until) g
WHERE name = $1
RETURNING previous_secret_until;

-- name: destination_get
SELECT id, name, url, events, secret, enabled, max_in_flight, ordered, breaker_state, format
FROM destinations WHERE name = $1;

-- name: destination_set_enabled
UPDATE destinations SET enabled = $2, updated_at = now() WHERE name = $1 RETURNING id;

-- name: destination_remove
-- The destination, its open deliveries and its leases go; how many deliveries it had (open, and
-- delivered ones the log still holds). Its log rows stay until their day partitions are dropped
-- (nothing reads them: every list joins destinations, and ids are never reused).
-- (The delivered ones are found by a join, not a subquery per destination: a Citus coordinator
-- refuses a correlated subquery over its distributed tables.)
WITH gone AS (DELETE FROM destinations WHERE name = $1 RETURNING id),
open AS (DELETE FROM delivery_queue q USING gone g WHERE q.destination_id = g.id RETURNING q.event_id),
done AS (
    SELECT DISTINCT l.event_id FROM delivery_log l JOIN gone g ON l.destination_id = g.id
    WHERE l.outcome = 'delivered'
)
SELECT g.id,
       (SELECT count(*) FROM open)
       + (SELECT count(*) FROM done WHERE done.event_id NOT IN (SELECT event_id FROM open)) AS deliveries
FROM gone g;

-- name: forward_round
-- One forwarder round: see sql/functions/forward_round.sql.
SELECT * FROM forward_round(
    p_forwarder => $1, p_outcomes => $2, p_held => $3, p_tallies => $4, p_gone => $5, p_limit => $6,
    p_lanes => $7, p_lease_s => $8, p_breaker_failures => $9, p_housekeeping => $10, p_cooldown_s => $11);

-- name: deliveries_gauge_destinations
SELECT id, name, breaker_state, enabled, due_from FROM destinations ORDER BY name;

-- name: deliveries_gauge
-- One destination's queued deliveries ($1 its id, $2 its due_from) and the age of the oldest due
-- one (receipt time). Bounded work every refresh, whatever the backlog (a day-long outage queues
-- millions): the queue is read on the claim's index from due_from (past the dead entries, see
-- sql/functions/forward_round.sql) and only up to $3 rows, so a backlog at the cap reads "at
-- least this many" and the age is the oldest among the first $3 due (exact below the cap). One
-- statement per destination: on a Citus cluster a subquery over the queue's shards cannot refer
-- to a destination's row, so neither may it here.
SELECT (SELECT count(*) FROM (
            SELECT 1 FROM delivery_queue x
            WHERE x.destination_id = $1 AND NOT x.failed AND x.due >= $2
            LIMIT $3) c) AS backlog,
       coalesce((SELECT extract(epoch FROM clock_timestamp() - min(c.received_at)) FROM (
                     SELECT x.received_at FROM delivery_queue x
                     WHERE x.destination_id = $1 AND NOT x.failed
                       AND x.due >= $2 AND x.due <= clock_timestamp()
                     ORDER BY x.due, x.event_id
                     LIMIT $3) c), 0)::float8 AS oldest_due_s;

-- name: deliveries_list
-- $1 destination name, $2/$3 receipt time range [since, until), $4 state (each NULL: any), $5
-- limit; by event id (the order the gateway processed the events). Open deliveries from the
-- queue (one a forwarder holds is delivering), delivered ones from the log (a delivery replayed
-- and delivered again once). Each half joins its own rows to their events and destinations on
-- the lane and is limited on its own: on a Citus cluster each half is then one query per shard
-- (Citus cannot join the union of the two to the events).
WITH held AS (
    SELECT l.destination_id, unnest(l.ids) AS event_id FROM delivery_leases l
)
(SELECT * FROM (
    SELECT q.event_id AS id, d.name AS destination, delivery_webhook_id(d.name, e.event_key) AS webhook_id,
           e.event_key, e.kind,
           CASE WHEN q.failed THEN 'failed'
                WHEN (q.destination_id, q.event_id) IN (SELECT destination_id, event_id FROM held) THEN 'delivering'
                ELSE 'pending' END AS state,
           q.attempts, q.received_at, q.due AS next_attempt_at, q.last_status::integer AS last_status,
           q.last_error, NULL::timestamptz AS delivered_at
    FROM delivery_queue q
    JOIN destinations d ON d.id = q.destination_id
    JOIN delivery_events e ON e.id = q.event_id AND e.day = q.event_day AND e.lane = q.lane
    WHERE ($1::text IS NULL OR d.name = $1)
      AND ($2::timestamptz IS NULL OR q.received_at >= $2) AND ($3::timestamptz IS NULL OR q.received_at < $3)
 ) open
 WHERE $4::text IS NULL OR open.state = $4
 ORDER BY open.id, open.destination
 LIMIT $5)
UNION ALL
(SELECT DISTINCT ON (l.event_id, d.name)
        l.event_id, d.name, delivery_webhook_id(d.name, e.event_key), e.event_key, e.kind, 'delivered',
        l.attempt, l.received_at, l.at, l.status::integer, l.error, l.at
 FROM delivery_log l
 JOIN destinations d ON d.id = l.destination_id
 JOIN delivery_events e ON e.id = l.event_id AND e.day = l.event_day AND e.lane = l.lane
 WHERE l.outcome = 'delivered' AND ($1::text IS NULL OR d.name = $1)
   AND ($2::timestamptz IS NULL OR l.received_at >= $2) AND ($3::timestamptz IS NULL OR l.received_at < $3)
   AND ($4::text IS NULL OR $4 = 'delivered')
   AND NOT EXISTS (SELECT 1 FROM delivery_queue q
                   WHERE q.destination_id = l.destination_id AND q.event_id = l.event_id AND q.lane = l.lane)
 ORDER BY l.event_id, d.name, l.at DESC
 LIMIT $5)
ORDER BY 1, 2
LIMIT $5;

-- name: deliveries_count
-- Deliveries per state, as deliveries_list has them ($1 destination, [$2, $3) receipt time).
WITH held AS (
    SELECT l.destination_id, unnest(l.ids) AS event_id FROM delivery_leases l
)
SELECT x.state, count(*) AS n
FROM (
    SELECT CASE WHEN q.failed THEN 'failed'
                WHEN (q.destination_id, q.event_id) IN (SELECT destination_id, event_id FROM held) THEN 'delivering'
                ELSE 'pending' END AS state
    FROM delivery_queue q
    JOIN destinations d ON d.id = q.destination_id
    WHERE ($1::text IS NULL OR d.name = $1)
      AND ($2::timestamptz IS NULL OR q.received_at >= $2) AND ($3::timestamptz IS NULL OR q.received_at < $3)
    UNION ALL
    SELECT 'delivered'
    FROM (SELECT DISTINCT l.destination_id, l.event_id, l.lane
          FROM delivery_log l
          JOIN destinations d ON d.id = l.destination_id
          WHERE l.outcome = 'delivered' AND ($1::text IS NULL OR d.name = $1)
            AND ($2::timestamptz IS NULL OR l.received_at >= $2) AND ($3::timestamptz IS NULL OR l.received_at < $3)
            AND NOT EXISTS (SELECT 1 FROM delivery_queue q
                            WHERE q.destination_id = l.destination_id AND q.event_id = l.event_id
                              AND q.lane = l.lane)) y
) x(state)
GROUP BY x.state;

-- name: deliveries_replay_failed
-- Failed deliveries in a receipt time range back to due now, with a fresh retry window.
-- (The clock is read in a sub-select: Citus refuses a volatile function in an UPDATE's SET.)
UPDATE delivery_queue q SET
    failed = false, attempts = 0, due = c.now, window_start = c.now
FROM destinations d, (SELECT clock_timestamp() AS now) c
WHERE d.id = q.destination_id
  AND ($1::text IS NULL OR d.name = $1)
  AND ($2::timestamptz IS NULL OR q.received_at >= $2)
  AND ($3::timestamptz IS NULL OR q.received_at < $3)
  AND q.failed
RETURNING q.event_id;

-- name: deliveries_replay_delivered
-- Delivered deliveries in a receipt time range queued again, due now (the same delivery: its
-- event, body and webhook id), while their event's body is kept (the caller holds
-- deliveries_bodies_lock_shared: retention neither carries nor drops bodies meanwhile); those
-- whose body retention dropped are counted as expired. Returns (replayed, expired).
WITH cand AS (
    SELECT DISTINCT ON (l.destination_id, l.event_id)
           l.destination_id, l.event_id, l.received_at, l.event_day, l.lane, d.ordered
    FROM delivery_log l
    JOIN destinations d ON d.id = l.destination_id
    WHERE l.outcome = 'delivered'
      AND ($1::text IS NULL OR d.name = $1)
      AND ($2::timestamptz IS NULL OR l.received_at >= $2)
      AND ($3::timestamptz IS NULL OR l.received_at < $3)
    ORDER BY l.destination_id, l.event_id
), kept AS (
    SELECT c.*, e.conversation
    FROM cand c
    JOIN delivery_events e ON e.id = c.event_id AND e.day = c.event_day AND e.lane = c.lane
), ins AS (
    INSERT INTO delivery_queue (destination_id, event_id, received_at, conv, event_day, lane)
    SELECT k.destination_id, k.event_id, k.received_at,
           CASE WHEN k.ordered THEN delivery_conversation(k.conversation) END, k.event_day, k.lane
    FROM kept k
    ORDER BY k.destination_id, k.event_id
    ON CONFLICT (destination_id, event_id, lane) DO NOTHING
    RETURNING 1
)
SELECT (SELECT count(*) FROM ins) AS replayed,
       (SELECT count(*) FROM cand) - (SELECT count(*) FROM kept) AS expired;

-- name: deliveries_notify
-- $1: the payload ('', or the forwarder the notifying process woke itself: see
-- sql/functions/deliveries_notify.sql).
SELECT pg_notify('deliveries', $1::text);

-- name: deliveries_bodies_lock_shared
-- Held while a statement refers to stored bodies again (a replay of delivered deliveries); the
-- retention pass holds it exclusively while it carries open deliveries' bodies forward and drops
-- old days (sql/queries/retention.sql: deliveries_bodies_lock).
SELECT pg_advisory_xact_lock_shared(431198006902);

-- name: deliveries_lock_destination
-- Backfills of one destination ($1) one at a time (the check for events it already has, and
-- the insert, would otherwise race).
SELECT pg_advisory_xact_lock(1684368498, $1::integer);

-- name: deliveries_insert
-- Backfill: deliveries for one destination ($1) from rebuilt events ($2: jsonb array of key,
-- kind, conversation, envelope, received_at, number, callback). Events it already has (queued,
-- or delivered and still in the log) are skipped, and so are other numbers' events when the
-- destination is limited to numbers. Each event gets an event row of its own, its body rendered
-- for the destination's format: a Meta-format one gets Meta's body, as a live delivery
-- (inbox_apply_batch), with the caller's biz_opaque_callback_data of a send of ours that the
-- outbox still holds.
WITH d AS (
    SELECT id, format, ordered, numbers FROM destinations WHERE id = $1
), f AS (
    SELECT f.*, event_subject(f.key) AS subject
    FROM jsonb_to_recordset($2::jsonb) AS f(
        key text, kind text, conversation text, envelope jsonb, received_at timestamptz, number text,
        callback text)
), have AS (
    -- Events of these keys the destination already has (one query per shard on Citus: the
    -- look-ups stay on the event's lane).
    SELECT e.event_key
    FROM delivery_events e
    WHERE e.event_key IN (SELECT f.key FROM f)
      AND (EXISTS (SELECT 1 FROM delivery_queue q
                   WHERE q.destination_id = $1 AND q.event_id = e.id AND q.lane = e.lane)
           OR EXISTS (SELECT 1 FROM delivery_log l
                      WHERE l.destination_id = $1 AND l.received_at = e.received_at
                        AND l.event_id = e.id AND l.lane = e.lane AND l.outcome = 'delivered'))
), want AS (
    SELECT f.*, d.format, d.ordered
    FROM f JOIN d ON (d.numbers IS NULL OR f.number = ANY (d.numbers))
                 AND (d.format = 'standard' OR f.envelope->>'source' = 'meta')
    WHERE NOT EXISTS (SELECT 1 FROM have h WHERE h.event_key = f.key)
), cb AS (
    -- The trackers of sends of ours the events name (callback_data is unique in the outbox).
    SELECT o.callback_data, coalesce(to_jsonb(o.biz_opaque_callback_data), 'null'::jsonb) AS tracker
    FROM outbox o
    WHERE o.callback_data IN (SELECT w.callback FROM want w WHERE w.callback IS NOT NULL)
), ev AS (
    INSERT INTO delivery_events (lane, received_at, event_key, kind, conversation, body, meta_body)
    SELECT delivery_lane(w.conversation, w.subject), w.received_at, w.key, w.kind, w.conversation,
           CASE WHEN w.format = 'standard' THEN convert_to(w.envelope::text, 'UTF8') END,
           CASE WHEN w.format = 'meta' THEN convert_to(meta_webhook(w.envelope, cb.tracker)::text, 'UTF8') END
    FROM want w
    LEFT JOIN cb ON cb.callback_data = w.callback
    ORDER BY w.received_at, w.key
    RETURNING id, day, lane, received_at, conversation
), ins AS (
    INSERT INTO delivery_queue (destination_id, event_id, received_at, conv, event_day, lane)
    SELECT d.id, e.id, e.received_at, CASE WHEN d.ordered THEN delivery_conversation(e.conversation) END,
           e.day, e.lane
    FROM ev e CROSS JOIN d
    ORDER BY e.id
    RETURNING 1
)
SELECT count(*) FROM ins;

-- name: backfill_messages
-- Inbound messages received in [$1, $2), after id $3, $4 at most. A Tenashi message's key
-- (evt:<id>) is found beside it in processed_webhook_events (same transaction, same inbox
-- row, same subject: the event id); NULL once retention purged it. (The subject also keeps the
-- look-up on the message's own shard on a Citus cluster.)
SELECT m.id, m.wamid, m.source, m.phone_number_id, m.sender, m.type, m.timestamp,
       m.contact_name, m.message, m.received_at, m.user_id, m.parent_user_id, m.username,
       m.waba_id, m.display_phone_number, m.contact,
       CASE WHEN m.source = 'meta' THEN 'msg:' || m.wamid
            ELSE (SELECT p.event_key FROM processed_webhook_events p
                  -- evt: keys are untimed: one partition, with a processed_at index.
                  WHERE p.event_day = DATE '1970-01-01'
                    AND p.processed_at >= m.received_at
                    AND p.processed_at < m.received_at + interval '10 minutes'
                    AND p.subject = m.subject AND p.inbox_id = m.inbox_id
                    AND p.event_key LIKE 'evt:%'
                  LIMIT 1) END AS event_key
FROM inbound_messages m
WHERE m.received_at >= $1 AND m.received_at < $2 AND m.id > $3
ORDER BY m.id
LIMIT $4;

-- name: backfill_statuses
SELECT id, event_key, source, wamid, status, participant, recipient, timestamp, callback_data,
       errors, raw, recorded_at AS received_at, recipient_user_id, recipient_parent_user_id,
       recipient_username, phone_number_id, waba_id, display_phone_number, contact,
       biz_opaque_callback_data
FROM message_statuses
WHERE recorded_at >= $1 AND recorded_at < $2 AND id > $3
ORDER BY id
LIMIT $4;

-- name: backfill_account_errors
SELECT id, event_key, waba_id, phone_number_id, field, errors, raw, recorded_at AS received_at
FROM account_errors
WHERE recorded_at >= $1 AND recorded_at < $2 AND id > $3
ORDER BY id
LIMIT $4;

-- name: backfill_account_updates
SELECT id, event_key, waba_id, field, value, recorded_at AS received_at
FROM account_updates
WHERE recorded_at >= $1 AND recorded_at < $2 AND id > $3
ORDER BY id
LIMIT $4;
