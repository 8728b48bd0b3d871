-- destinations and deliveries: forwarding to downstream HTTP endpoints. The consumers'
-- inbox_apply_batch inserts deliveries; everything else about them is here.
-- A webhook id is 'wh_' + 32 hex of sha256('<destination name>/<event key>') everywhere.

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
       (SELECT count(*) FROM deliveries x
        WHERE x.destination_id = d.id AND x.state IN ('pending', 'delivering')) AS backlog,
       (SELECT count(*) FROM deliveries x WHERE x.destination_id = d.id AND x.state = 'failed') AS failed,
       -- disabled by a 410 Gone answer: its waiting delivery says so (until it is re-enabled)
       NOT d.enabled AND EXISTS (SELECT 1 FROM deliveries x
                                 WHERE x.destination_id = d.id AND x.state = 'pending'
                                   AND x.last_status = 410) AS gone
FROM destinations d
ORDER BY d.name;

-- name: destination_rotate_secret
-- $2 becomes the secret; the current one stays valid (signed with too) for $3 seconds.
-- A rotation during a grace period drops the oldest: two secrets at most.
UPDATE destinations SET
    previous_secret = secret,
    previous_secret_until = clock_timestamp() + make_interval(secs => $3),
    secret = $2,
    updated_at = now()
WHERE name = $1
RETURNING previous_secret_until;

-- name: destination_get
SELECT id, name, url, events, secret, enabled, max_in_flight, ordered, breaker_state, format
FROM destinations WHERE name = $1;

-- name: destination_set_enabled
UPDATE destinations SET enabled = $2, updated_at = now() WHERE name = $1 RETURNING id;

-- name: destination_remove
-- Its deliveries go with it (ON DELETE CASCADE); returns how many there were.
WITH gone AS (DELETE FROM destinations WHERE name = $1 RETURNING id)
SELECT g.id, (SELECT count(*) FROM deliveries x WHERE x.destination_id = g.id) AS deliveries
FROM gone g;

-- name: forward_round
-- One forwarder round: see sql/functions/forward_round.sql.
SELECT * FROM forward_round($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16);

-- name: deliveries_gauges
-- Per destination: open deliveries, age of the oldest due one (receipt time), breaker state.
-- Bounded work every refresh, whatever the backlog (a day-long outage queues millions): the
-- pending deliveries are read on the claim's index from due_from (past the dead entries, see
-- sql/functions/forward_round.sql) and only up to $1 of them, so a backlog at the cap reads "at least this
-- many" and the age is the oldest among the first $1 due (exact below the cap).
SELECT d.name, d.breaker_state, d.enabled,
       (SELECT count(*) FROM (
            SELECT FROM deliveries x
            WHERE x.destination_id = d.id AND x.state = 'pending' AND x.next_attempt_at >= d.due_from
            LIMIT $1) c) AS backlog,
       coalesce((SELECT extract(epoch FROM clock_timestamp() - min(c.received_at)) FROM (
                     SELECT x.received_at FROM deliveries x
                     WHERE x.destination_id = d.id AND x.state = 'pending'
                       AND x.next_attempt_at >= d.due_from AND x.next_attempt_at <= clock_timestamp()
                     ORDER BY x.next_attempt_at, x.id
                     LIMIT $1) c), 0)::float8 AS oldest_due_s
FROM destinations d
ORDER BY d.name;

-- name: deliveries_list
-- $1 destination name, $2/$3 receipt time range [since, until), $4 state (each NULL: any), $5 limit.
-- A pending delivery a forwarder holds (delivery_leases) is shown as delivering.
WITH held AS (SELECT unnest(ids) AS id FROM delivery_leases)
SELECT * FROM (
    SELECT dl.id, d.name AS destination, dl.webhook_id, dl.event_key, dl.kind,
           CASE WHEN dl.state = 'pending' AND dl.id IN (SELECT id FROM held) THEN 'delivering'
                ELSE dl.state END AS state,
           dl.attempts, dl.received_at, dl.next_attempt_at, dl.last_status, dl.last_error, dl.delivered_at
    FROM deliveries dl JOIN destinations d ON d.id = dl.destination_id
    WHERE ($1::text IS NULL OR d.name = $1)
      AND ($2::timestamptz IS NULL OR dl.received_at >= $2)
      AND ($3::timestamptz IS NULL OR dl.received_at < $3)
) x
WHERE ($4::text IS NULL OR x.state = $4)
ORDER BY x.id
LIMIT $5;

-- name: deliveries_count
WITH held AS (SELECT unnest(ids) AS id FROM delivery_leases)
SELECT CASE WHEN dl.state = 'pending' AND dl.id IN (SELECT id FROM held) THEN 'delivering'
            ELSE dl.state END AS state,
       count(*) AS n
FROM deliveries dl JOIN destinations d ON d.id = dl.destination_id
WHERE ($1::text IS NULL OR d.name = $1)
  AND ($2::timestamptz IS NULL OR dl.received_at >= $2)
  AND ($3::timestamptz IS NULL OR dl.received_at < $3)
GROUP BY 1;

-- name: deliveries_replay
-- Finished deliveries ($4: failed or delivered) in a receipt time range back to pending now,
-- with a fresh retry window. The webhook id is unchanged, so a receiver that already has
-- one of them can tell.
UPDATE deliveries dl SET
    state = 'pending', attempts = 0, next_attempt_at = clock_timestamp(),
    window_start = clock_timestamp(), lease_until = NULL
FROM destinations d
WHERE d.id = dl.destination_id
  AND ($1::text IS NULL OR d.name = $1)
  AND ($2::timestamptz IS NULL OR dl.received_at >= $2)
  AND ($3::timestamptz IS NULL OR dl.received_at < $3)
  AND dl.state = $4
  AND $4 IN ('failed', 'delivered')
RETURNING dl.id;

-- name: deliveries_notify
SELECT pg_notify('deliveries', '');

-- name: deliveries_insert
-- Backfill: deliveries for one destination ($1) from rebuilt events ($2: jsonb array of key,
-- kind, conversation, envelope, received_at, number, callback); events it already has are
-- skipped, and so are other numbers' events when the destination is limited to numbers. A
-- Meta-format destination gets Meta's body, as a live delivery (inbox_apply_batch), with the
-- caller's biz_opaque_callback_data of a send of ours that the outbox still holds.
WITH ins AS (
    INSERT INTO deliveries
        (destination_id, event_key, webhook_id, kind, conversation, envelope, received_at, subject)
    SELECT d.id, f.key,
           'wh_' || left(encode(sha256(convert_to(d.name || '/' || f.key, 'UTF8')), 'hex'), 32),
           f.kind, f.conversation,
           CASE WHEN d.format = 'meta' THEN meta_webhook(f.envelope, cb.tracker) ELSE f.envelope END,
           f.received_at, event_subject(f.key)
    FROM jsonb_to_recordset($2::jsonb) AS f(
        key text, kind text, conversation text, envelope jsonb, received_at timestamptz, number text,
        callback text)
    LEFT JOIN LATERAL (SELECT coalesce(to_jsonb(o.biz_opaque_callback_data), 'null'::jsonb) AS tracker
                       FROM outbox o WHERE f.callback IS NOT NULL AND o.callback_data = f.callback) cb ON true
    JOIN destinations d ON d.id = $1 AND (d.numbers IS NULL OR f.number = ANY (d.numbers))
                       AND (d.format = 'standard' OR f.envelope->>'source' = 'meta')
    ORDER BY f.received_at, f.key
    ON CONFLICT (destination_id, event_key, subject) DO NOTHING
    RETURNING 1
)
SELECT count(*) FROM ins;

-- name: backfill_messages
-- Inbound messages received in [$1, $2), after id $3, $4 at most. A Tenashi message's key
-- (evt:<id>) is found beside it in processed_webhook_events (same transaction, same inbox
-- row); NULL once retention purged it.
SELECT m.id, m.wamid, m.source, m.phone_number_id, m.sender, m.type, m.timestamp,
       m.contact_name, m.message, m.received_at, m.user_id, m.parent_user_id, m.username,
       m.waba_id, m.display_phone_number, m.contact,
       CASE WHEN m.source = 'meta' THEN 'msg:' || m.wamid
            ELSE (SELECT p.event_key FROM processed_webhook_events p
                  -- evt: keys are untimed: one partition, with a processed_at index.
                  WHERE p.event_day = DATE '1970-01-01'
                    AND p.processed_at >= m.received_at
                    AND p.processed_at < m.received_at + interval '10 minutes'
                    AND p.inbox_id = m.inbox_id AND p.event_key LIKE 'evt:%'
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
