-- destinations and deliveries: forwarding to downstream HTTP endpoints. The consumers'
-- inbox_apply_batch inserts deliveries; everything else about them is here.
-- A webhook id is 'wh_' + 32 hex of sha256('<destination name>/<event key>') everywhere.

-- name: destination_add
INSERT INTO destinations (name, url, events, secret, max_in_flight, ordered)
VALUES ($1, $2, $3::text[], $4, $5, $6)
ON CONFLICT (name) DO NOTHING
RETURNING id;

-- name: destination_list
SELECT d.id, d.name, d.url, d.events, d.secret, d.enabled, d.max_in_flight, d.ordered,
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
SELECT id, name, url, events, secret, enabled, max_in_flight, ordered, breaker_state
FROM destinations WHERE name = $1;

-- name: destination_set_enabled
UPDATE destinations SET enabled = $2, updated_at = now() WHERE name = $1 RETURNING id;

-- name: destination_remove
-- Its deliveries go with it (ON DELETE CASCADE); returns how many there were.
WITH gone AS (DELETE FROM destinations WHERE name = $1 RETURNING id)
SELECT g.id, (SELECT count(*) FROM deliveries x WHERE x.destination_id = g.id) AS deliveries
FROM gone g;

-- name: deliveries_cycle_begin
-- Opens a forwarder round (one simple query: BEGIN and the lock in one round trip). Claims
-- are serialised across forwarders (one short transaction each; the next statement's
-- snapshot is taken after the lock), so per-destination limits and half-open probes are exact
-- however many forwarders run. The lock key is 0x666F72776172 64 ("forward").
-- The round commits without waiting for the WAL flush: a crash of PostgreSQL may forget its
-- last few ms, i.e. a claim (the rows are due again), an outcome (the lease runs out and the
-- delivery is sent again with the same webhook-id, which the receiver deduplicates) or a
-- breaker count. At least once holds; the deliveries themselves are inserted by the
-- consumers' synchronous commit.
BEGIN;
SELECT set_config('synchronous_commit', 'off', true), pg_advisory_xact_lock(28832985044316772);

-- name: deliveries_cycle_end
COMMIT;

-- name: deliveries_release_expired
-- The leases of a forwarder that died (it stopped renewing them): their deliveries are due
-- again (at least once, deduplicable). Rows an earlier version marked 'delivering' likewise.
WITH gone AS (
    DELETE FROM delivery_leases WHERE lease_until < clock_timestamp() RETURNING cardinality(ids) AS n
), legacy AS (
    UPDATE deliveries SET state = 'pending', lease_until = NULL
    WHERE state = 'delivering' AND lease_until < clock_timestamp()
    RETURNING id
)
SELECT (SELECT coalesce(sum(n), 0) FROM gone)::bigint + (SELECT count(*) FROM legacy) AS released;

-- name: destinations_half_open
-- An open breaker whose cool-down ($1 seconds) has passed lets one probe through.
UPDATE destinations SET breaker_state = 'half_open', breaker_changed_at = now()
WHERE breaker_state = 'open' AND breaker_changed_at <= clock_timestamp() - make_interval(secs => $1)
RETURNING name;

-- name: deliveries_round
-- One forwarder round in one statement (after deliveries_cycle_begin): write the outcomes of
-- finished attempts and the breaker counts they imply, claim due deliveries, and record what
-- the forwarder ($13) now holds in its leases. Every part sees the same snapshot: the claim
-- counts every lease as it was before this round, gives back each destination the room
-- this round's outcomes free, and uses the breaker states this statement decides. (A
-- conversation's next delivery waits for the next round: in this snapshot its predecessor
-- is still pending. The forwarder runs that round at once.) Housekeeping
-- (deliveries_release_expired, destinations_half_open) runs after this statement, in the
-- same transaction, so a lease is renewed before leases are judged.
--
-- Outcomes: $1 ids, $2 new states, $3 seconds to the next attempt (pending only), $4 HTTP
-- statuses (NULL: no answer), $5 errors. Only deliveries this forwarder still holds are
-- written: a lease that ran out was deleted and its deliveries may be another forwarder's.
-- Breakers: $6 destination ids, $7 any success, $8 failures after the last success, $9 the
-- threshold: a success restarts the count and closes the breaker unless it is open (then only
-- its half-open probe closes it); N consecutive failures (or a failed half-open probe) open
-- it. A destination row is written only when its count or state changes (the common all-2xx
-- round touches none). $12: destinations that answered 410 Gone: disabled (no breaker
-- count); nothing more is claimed for them.
-- Claim: due pending deliveries of enabled destinations whose breaker lets them through and
-- that no lease holds, at most (max_in_flight - held) per destination (1 when half-open),
-- $10 in all; with ordering, only the oldest open delivery of each conversation. A claim
-- writes no delivery row (its attempt is counted with its outcome); the forwarder's lease
-- rows get the ids it holds now and a lease of $11 seconds.
-- Rows: each claimed delivery (the columns of gateway.store.deliveries.Claimed, in its
-- order; times as Unix seconds), then one row per breaker transition (id NULL; destination,
-- old state, new state in the destination, webhook_id and body columns), and one
-- (destination, 'enabled', 'gone') per destination this round disabled.
WITH r AS (
    SELECT * FROM unnest($1::bigint[], $2::text[], $3::float8[], $4::int[], $5::text[])
        AS r(id, state, delay, status, error)
), leased AS (
    -- every forwarder's held deliveries, before this round
    SELECT l.forwarder, l.destination_id, h.id
    FROM delivery_leases l CROSS JOIN LATERAL unnest(l.ids) AS h(id)
), ok AS (
    SELECT r.*, x.destination_id FROM r JOIN leased x ON x.id = r.id AND x.forwarder = $13
), upd AS (
    UPDATE deliveries d SET
        state = ok.state,
        attempts = d.attempts + 1,
        next_attempt_at = CASE WHEN ok.state = 'pending'
                               THEN clock_timestamp() + make_interval(secs => ok.delay)
                               ELSE d.next_attempt_at END,
        last_status = ok.status,
        last_error = ok.error,
        delivered_at = CASE WHEN ok.state = 'delivered' THEN clock_timestamp() ELSE d.delivered_at END
    FROM ok
    -- "still pending", written so that it implies no partial index's predicate: only the
    -- primary key can serve this join (with stale statistics, as after a large backlog was
    -- queued, the planner once chose a skip scan of deliveries_due here, 150 µs a row).
    WHERE d.id = ok.id AND d.state NOT IN ('delivering', 'delivered', 'failed')
), held AS (
    -- per destination: held by any forwarder, and freed by this round's outcomes
    SELECT x.destination_id, count(*)::int AS n,
           count(*) FILTER (WHERE x.forwarder = $13 AND x.id IN (SELECT id FROM r))::int AS freed
    FROM leased x GROUP BY x.destination_id
), b0 AS (
    SELECT * FROM unnest($6::bigint[], $7::bool[], $8::int[]) AS b(id, ok, fails)
), b AS (
    -- with the destinations that answered 410 Gone ($12), which are disabled here
    SELECT coalesce(b0.id, g.id) AS id, coalesce(b0.ok, false) AS ok, coalesce(b0.fails, 0) AS fails,
           b0.id IS NOT NULL AS counted, g.id IS NOT NULL AS gone
    FROM b0 FULL JOIN unnest($12::bigint[]) AS g(id) ON g.id = b0.id
), n AS (
    SELECT d.id, d.breaker_state AS old, d.consecutive_failures AS old_fails, d.enabled AS was_enabled,
           b.ok, b.fails AS new_fails, b.counted, b.gone,
           CASE WHEN b.ok THEN b.fails ELSE d.consecutive_failures + b.fails END AS fails
    FROM destinations d JOIN b ON b.id = d.id
), s AS (
    SELECT n.*,
           CASE WHEN NOT n.counted THEN n.old
                WHEN n.fails >= $9 OR (n.old = 'half_open' AND n.new_fails > 0) THEN 'open'
                -- An open breaker is closed only by its half-open probe: a 2xx now comes from
                -- a request sent before it opened and says little (else it flaps).
                WHEN n.ok AND n.old <> 'open' THEN 'closed'
                ELSE n.old END AS state
    FROM n
), brk AS (
    UPDATE destinations d SET
        consecutive_failures = s.fails,
        breaker_state = s.state,
        breaker_changed_at = CASE WHEN s.state <> s.old THEN now() ELSE d.breaker_changed_at END,
        enabled = d.enabled AND NOT s.gone,
        updated_at = CASE WHEN s.gone AND d.enabled THEN now() ELSE d.updated_at END
    FROM s
    WHERE d.id = s.id AND (s.state <> s.old OR s.fails <> s.old_fails OR (s.gone AND s.was_enabled))
    RETURNING d.name, s.old, s.state AS new, s.gone AND s.was_enabled AS disabled
), dest AS (
    SELECT d.id, d.name, d.url, d.secret, d.ordered,
           -- during a rotation's grace period, signed with the previous secret too
           CASE WHEN d.previous_secret_until > clock_timestamp() THEN d.previous_secret END
               AS previous_secret,
           CASE WHEN coalesce(s.state, d.breaker_state) = 'half_open' THEN 1 ELSE d.max_in_flight END
           - coalesce(h.n, 0) + coalesce(h.freed, 0) AS room
    FROM destinations d LEFT JOIN s ON s.id = d.id LEFT JOIN held h ON h.destination_id = d.id
    WHERE d.enabled AND NOT coalesce(s.gone, false)
      AND coalesce(s.state, d.breaker_state) <> 'open' AND $10 > 0
), picked AS (
    SELECT c.*, dest.id AS destination_id, dest.name AS destination, dest.url, dest.secret,
           dest.ordered, dest.previous_secret
    FROM dest
    CROSS JOIN LATERAL (
        SELECT dl.id, dl.webhook_id, dl.envelope, dl.attempts, dl.received_at, dl.window_start,
               dl.next_attempt_at
        FROM deliveries dl
        WHERE dl.destination_id = dest.id
          AND dl.state = 'pending'
          AND dl.next_attempt_at <= clock_timestamp()
          -- held ones: in flight, or finished in this round (not yet visible as such)
          AND dl.id NOT IN (SELECT id FROM leased)
          AND (NOT dest.ordered OR dl.conversation = '' OR NOT EXISTS (
                SELECT 1 FROM deliveries e
                WHERE e.destination_id = dl.destination_id
                  AND e.conversation = dl.conversation
                  AND e.id < dl.id
                  AND e.state IN ('pending', 'delivering')))
        ORDER BY dl.next_attempt_at, dl.id
        LIMIT least(dest.room, $10)
        FOR UPDATE OF dl SKIP LOCKED
    ) c
    WHERE dest.room > 0
    ORDER BY c.next_attempt_at, c.id
    LIMIT $10
), lease AS (
    INSERT INTO delivery_leases AS l (forwarder, destination_id, ids, lease_until)
    SELECT $13, k.destination_id, coalesce(array_agg(k.id) FILTER (WHERE k.id IS NOT NULL), '{}'),
           clock_timestamp() + make_interval(secs => $11)
    FROM (
        SELECT x.destination_id, x.id FROM leased x
        WHERE x.forwarder = $13 AND x.id NOT IN (SELECT id FROM r)
        UNION ALL
        SELECT p.destination_id, p.id FROM picked p
        UNION ALL  -- every lease of this forwarder is renewed, an empty one too
        SELECT l0.destination_id, NULL FROM delivery_leases l0 WHERE l0.forwarder = $13
    ) k
    GROUP BY k.destination_id
    ON CONFLICT (forwarder, destination_id)
        DO UPDATE SET ids = excluded.ids, lease_until = excluded.lease_until
)
-- upd and lease run to completion unreferenced, as every data-modifying CTE does.
SELECT p.id, p.webhook_id, p.envelope::text AS body, p.attempts + 1,
       extract(epoch FROM p.received_at)::float8 AS received_at,
       extract(epoch FROM p.window_start)::float8 AS window_start,
       p.destination_id, p.destination, p.url, p.secret, p.ordered, p.previous_secret
FROM picked p
UNION ALL
SELECT NULL, old, new, NULL, NULL, NULL, NULL, name, NULL, NULL, NULL, NULL FROM brk WHERE old <> new
UNION ALL
SELECT NULL, 'enabled', 'gone', NULL, NULL, NULL, NULL, name, NULL, NULL, NULL, NULL FROM brk WHERE disabled;

-- name: deliveries_gauges
-- Per destination: open deliveries, age of the oldest due one (receipt time), breaker state.
SELECT d.name, d.breaker_state, d.enabled,
       (SELECT count(*) FROM deliveries x
        WHERE x.destination_id = d.id AND x.state IN ('pending', 'delivering')) AS backlog,
       coalesce((SELECT extract(epoch FROM clock_timestamp() - min(x.received_at))
                 FROM deliveries x
                 WHERE x.destination_id = d.id AND x.state = 'pending'
                   AND x.next_attempt_at <= clock_timestamp()), 0)::float8 AS oldest_due_s
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
-- kind, conversation, envelope, received_at); events it already has are skipped.
WITH ins AS (
    INSERT INTO deliveries
        (destination_id, event_key, webhook_id, kind, conversation, envelope, received_at, subject)
    SELECT d.id, f.key,
           'wh_' || left(encode(sha256(convert_to(d.name || '/' || f.key, 'UTF8')), 'hex'), 32),
           f.kind, f.conversation, f.envelope, f.received_at, event_subject(f.key)
    FROM jsonb_to_recordset($2::jsonb) AS f(
        key text, kind text, conversation text, envelope jsonb, received_at timestamptz)
    JOIN destinations d ON d.id = $1
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
       m.contact_name, m.message, m.received_at,
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
       errors, raw, recorded_at AS received_at
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
