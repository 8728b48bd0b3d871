-- The outbox: enqueue, the sender's claims and results, the reconciler, operator commands.
-- Times that drive scheduling come in as epoch seconds from the caller's clock ($now),
-- so tests can run the sender and reconciler on a controllable clock.

-- name: outbox_enqueue
-- The new row with outbox_get's columns; nothing when (tenant, key) exists.
INSERT INTO outbox (tenant, idem_key, callback_data, provider, phone_number_id, recipient,
                    payload, unknown_policy, fingerprint, biz_opaque_callback_data, notify_outcome)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
ON CONFLICT (tenant, idem_key) DO NOTHING
RETURNING id, tenant, idem_key, callback_data, provider, phone_number_id, recipient, payload, state,
          unknown_policy, resent, attempts, next_attempt_at, last_error, last_error_code, wamid,
          delivery_status, delivery_errors, created_at, updated_at, sending_at, unknown_at, accepted_at,
          fingerprint, generation, ambiguous_at, retry_until, biz_opaque_callback_data;

-- name: outbox_enqueue_batch
-- The rows of concurrent requests, each under a fresh key of its own, in one statement: the
-- new rows with outbox_get's columns (matched to their requests by tenant and key); a key
-- that exists gets no row.
INSERT INTO outbox (tenant, idem_key, callback_data, provider, phone_number_id, recipient,
                    payload, unknown_policy, fingerprint, biz_opaque_callback_data, notify_outcome)
SELECT t.tenant, t.idem_key, t.callback_data, t.provider, t.phone_number_id, t.recipient,
       t.payload, t.unknown_policy, t.fingerprint, t.biz_opaque_callback_data, t.notify_outcome
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::jsonb[],
            $8::text[], $9::text[], $10::text[], $11::bool[])
     AS t(tenant, idem_key, callback_data, provider, phone_number_id, recipient, payload,
          unknown_policy, fingerprint, biz_opaque_callback_data, notify_outcome)
ON CONFLICT (tenant, idem_key) DO NOTHING
RETURNING id, tenant, idem_key, callback_data, provider, phone_number_id, recipient, payload, state,
          unknown_policy, resent, attempts, next_attempt_at, last_error, last_error_code, wamid,
          delivery_status, delivery_errors, created_at, updated_at, sending_at, unknown_at, accepted_at,
          fingerprint, generation, ambiguous_at, retry_until, biz_opaque_callback_data;

-- name: outbox_renew
-- A failed row (the provider refused it for good: nothing was sent) made into a new send for
-- the same key: a new body, a new generation with its own callback data, a fresh history.
-- $11 notify_outcome; $12 is the generation it replaces (a concurrent renewal of the same row
-- makes this a no-op). (The clock is read once in a sub-select: see outbox_record_results.)
UPDATE outbox
SET callback_data = $3, provider = $4, phone_number_id = $5, recipient = $6, payload = $7,
    unknown_policy = $8, fingerprint = $9, biz_opaque_callback_data = $10, generation = generation + 1,
    notify_outcome = $11, provider_error = NULL,
    state = 'pending', resent = false, attempts = 0, next_attempt_at = c.now,
    last_error = NULL, last_error_code = NULL, wamid = NULL, delivery_status = NULL,
    delivery_errors = NULL, sending_at = NULL, unknown_at = NULL, accepted_at = NULL,
    ambiguous_at = NULL, retry_until = NULL, created_at = c.now, updated_at = c.now
FROM (SELECT clock_timestamp() AS now) c
WHERE tenant = $1 AND idem_key = $2 AND state = 'failed' AND generation = $12
RETURNING id, state;

-- name: outbox_notify
-- Wake the senders when this transaction commits (a consumer's batch that enqueued replies).
SELECT pg_notify('outbox', '');

-- name: outbox_wake
-- Wake the senders now, in a transaction of its own that does not wait for its WAL flush: it
-- holds PostgreSQL's NOTIFY lock (which serialises the commits of all transactions that
-- NOTIFY) for no flush, and a wake lost in a crash costs the senders one poll.
SELECT set_config('synchronous_commit', 'off', true), pg_notify('outbox', '');

-- name: outbox_outcome_final
-- Of rows $1, those a Graph-compatible request waits for (notify_outcome) in a state that ends
-- its wait, as the trigger outbox_outcome_notify announces them on one PostgreSQL; the payload
-- of its NOTIFY. For a session that announces them itself (outbox_outcome_announce).
SELECT o.id::text || ' ' || o.state || ' ' || coalesce(o.wamid, '') AS payload
FROM outbox o
WHERE o.id = ANY ($1::bigint[]) AND o.notify_outcome
  AND o.state IN ('accepted', 'failed', 'unknown', 'review', 'cancelled');

-- name: outbox_outcome_announce
-- NOTIFY outbox_outcome with each payload $1, where this session is: on a Citus coordinator
-- (no trigger there: a worker's NOTIFY reaches no listener, sql/citus/layout.sql) a statement
-- that reads outbox runs whole on the outbox's worker, NOTIFY included, hence two statements.
SELECT count(*) FROM (SELECT pg_notify('outbox_outcome', p)::text FROM unnest($1::text[]) AS p) n;

-- name: outbox_get
SELECT id, tenant, idem_key, callback_data, provider, phone_number_id, recipient, payload, state,
       unknown_policy, resent, attempts, next_attempt_at, last_error, last_error_code, wamid,
       delivery_status, delivery_errors, created_at, updated_at, sending_at, unknown_at, accepted_at,
       fingerprint, generation, ambiguous_at, retry_until, biz_opaque_callback_data
FROM outbox
WHERE tenant = $1 AND idem_key = $2;

-- name: outbox_cancel_pending
-- DELETE /v1/messages/{key}: a row still pending is cancelled; any other is left as it is.
-- Returns the row's state (after the change) and whether this call cancelled it; no row: no
-- such key. A row a sender has claimed is locked: this waits for the claim, then finds it
-- no longer pending.
WITH c AS (
    UPDATE outbox o SET state = 'cancelled', updated_at = t.now
    FROM (SELECT clock_timestamp() AS now) t
    WHERE o.tenant = $1 AND o.idem_key = $2 AND o.state = 'pending'
    RETURNING o.state
)
SELECT coalesce((SELECT state FROM c), o.state) AS state, EXISTS (SELECT 1 FROM c) AS cancelled
FROM outbox o
WHERE o.tenant = $1 AND o.idem_key = $2;

-- name: outbox_claim_candidates
-- Due pending rows, locked for this claim's transaction; concurrent senders skip each other's.
-- Pacing and breakers then decide which of them go (outbox_mark_sending) and which wait.
-- person: whom the recipient names on the sending number, so the phone number and the BSUID of
-- one customer are paced as one pair: the BSUID last seen with that phone number or parent
-- BSUID (customer_ids), else the recipient itself.
-- ahead_*: the nearest earlier row (by id) to the same person from the same number (whichever
-- tenant enqueued it: the pair's pace is one too) that may still be sent: pending, sending, or unknown with its one resend still to come (named by the
-- row's recipient, the person's BSUID, or the phone number or parent BSUID seen with it). The
-- row waits for it, whether this claim holds it, another sender does (SKIP LOCKED hides it from
-- this claim, not from this look-up), or it waits for a backoff, a breaker or its status.
WITH due AS (
    SELECT id, tenant, provider, phone_number_id, recipient, next_attempt_at
    FROM outbox
    WHERE state = 'pending' AND next_attempt_at <= to_timestamp($1::float8)
    ORDER BY next_attempt_at, id
    LIMIT $2
    FOR UPDATE SKIP LOCKED
), who AS MATERIALIZED (
    SELECT d.*,
           coalesce(CASE WHEN d.recipient ~ '^[0-9]+$' THEN
                             (SELECT c.user_id FROM customer_ids c
                              WHERE c.phone_number_id = d.phone_number_id AND c.wa_id = d.recipient
                              ORDER BY c.seen_at DESC LIMIT 1)
                         WHEN d.recipient ~ '^[A-Z]{2}\.ENT\.' THEN
                             (SELECT c.user_id FROM customer_ids c
                              WHERE c.phone_number_id = d.phone_number_id
                                AND c.parent_user_id = d.recipient
                              ORDER BY c.seen_at DESC LIMIT 1)
                    END, d.recipient) AS person
    FROM due d
)
SELECT w.id, w.tenant, w.provider, w.phone_number_id, w.recipient, w.person,
       a.id AS ahead_id, a.state AS ahead_state, extract(epoch FROM a.next_attempt_at)::float8 AS ahead_due
FROM who w
LEFT JOIN customer_ids c ON c.phone_number_id = w.phone_number_id AND c.user_id = w.person
LEFT JOIN LATERAL (
    SELECT e.id, e.state, e.next_attempt_at
    FROM outbox e
    WHERE e.phone_number_id = w.phone_number_id
      AND e.recipient IN (w.recipient, w.person, c.wa_id, c.parent_user_id)
      AND e.id < w.id
      AND e.state IN ('pending', 'sending', 'unknown')
      AND e.provider = w.provider
      AND (e.state <> 'unknown'
           OR (e.unknown_policy = 'resend' AND NOT e.resent AND e.wamid IS NULL AND e.delivery_status IS NULL))
    ORDER BY e.id DESC
    LIMIT 1
) a ON true
ORDER BY w.next_attempt_at, w.id;

-- name: outbox_mark_sending
-- The rows that go become 'sending'. A row past its retry_until (a Tenashi send whose first
-- attempt that may have reached Tenashi is older than the key window: a retry could send it
-- twice) goes to 'review' instead, with the reason (parked = true in the answer).
-- (The reason and the due time are computed in picked, a SELECT: see outbox_record_results.)
WITH picked AS MATERIALIZED (
    SELECT id, coalesce(retry_until <= to_timestamp($2::float8), false) AS expired,
           extract(epoch FROM next_attempt_at)::float8 AS due,
           'not sent again: its first attempt that may have reached ' || provider || ' was at '
           || to_char(ambiguous_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS') || ' UTC, and '
           || provider || ' honours its Idempotency-Key only until '
           || to_char(retry_until AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS')
           || ' UTC: a retry now could send it twice' AS reason
    FROM outbox
    WHERE id = ANY($1::bigint[]) AND state = 'pending'
), parked AS (
    UPDATE outbox o
    SET state = 'review', updated_at = c.now, last_error = p.reason
    FROM picked p, (SELECT clock_timestamp() AS now) c
    WHERE o.id = p.id AND p.expired
    RETURNING o.id, o.tenant, o.idem_key, o.callback_data, o.provider, o.phone_number_id, o.recipient,
              o.payload, o.attempts, p.due, true AS parked
), sent AS (
    UPDATE outbox o
    SET state = 'sending', sending_at = to_timestamp($2::float8), updated_at = c.now
    FROM picked p, (SELECT clock_timestamp() AS now) c
    WHERE o.id = p.id AND NOT p.expired
    RETURNING o.id, o.tenant, o.idem_key, o.callback_data, o.provider, o.phone_number_id, o.recipient,
              o.payload, o.attempts, p.due, false AS parked
)
SELECT * FROM sent
UNION ALL
SELECT * FROM parked;

-- name: outbox_defer
-- Pacing or a breaker holds these back: they stay pending, due later; not an attempt.
UPDATE outbox o
SET next_attempt_at = to_timestamp(t.at), updated_at = c.now
FROM unnest($1::bigint[], $2::float8[]) AS t(id, at), (SELECT clock_timestamp() AS now) c
WHERE o.id = t.id AND o.state = 'pending';

-- name: outbox_bring_forward
-- Rows put off until a recheck behind a send of their customer that is now done: due at the
-- earliest their pair allows, if that is sooner.
UPDATE outbox o
SET next_attempt_at = to_timestamp(t.at), updated_at = c.now
FROM unnest($1::bigint[], $2::float8[]) AS t(id, at), (SELECT clock_timestamp() AS now) c
WHERE o.id = t.id AND o.state = 'pending' AND o.next_attempt_at > to_timestamp(t.at);

-- name: outbox_record_results
-- Only rows still 'sending': a status webhook may already have moved one to accepted.
-- An account-level refusal (a breaker opened) counts no attempt. An attempt the provider may
-- have acted on ($10, or an unknown outcome) sets ambiguous_at once, and for Tenashi the last
-- moment a retry may go ($11 seconds later: its Idempotency-Key window). $12: the provider's
-- refusal as it answered (provider_error, the last one kept).
-- (Here and in the sender's other UPDATEs the clock is read once in a sub-select and times are
-- computed with immutable functions: a Citus coordinator refuses volatile functions in an
-- UPDATE, and STABLE ones such as timestamptz + interval over a column.)
UPDATE outbox o
SET state = t.state,
    ambiguous_at = CASE WHEN t.maybe_sent OR t.state = 'unknown'
                        THEN coalesce(o.ambiguous_at, to_timestamp(t.sent_at)) ELSE o.ambiguous_at END,
    retry_until = CASE WHEN (t.maybe_sent OR t.state = 'unknown') AND o.provider = 'tenashi'
                       THEN coalesce(o.retry_until, to_timestamp(t.sent_at + $11::float8))
                       ELSE o.retry_until END,
    attempts = o.attempts + CASE WHEN t.counted THEN 1 ELSE 0 END,
    wamid = coalesce(t.wamid, o.wamid),
    next_attempt_at = coalesce(to_timestamp(t.next_at), o.next_attempt_at),
    last_error = t.error,
    last_error_code = t.code,
    sending_at = to_timestamp(t.sent_at),
    unknown_at = CASE WHEN t.state = 'unknown' THEN to_timestamp($8::float8) ELSE o.unknown_at END,
    accepted_at = CASE WHEN t.state = 'accepted' THEN to_timestamp($8::float8) ELSE o.accepted_at END,
    provider_error = coalesce(t.refusal, o.provider_error),
    updated_at = c.now
FROM unnest($1::bigint[], $2::text[], $3::text[], $4::float8[], $5::text[], $6::int[], $7::float8[],
            $9::bool[], $10::bool[], $12::jsonb[])
     AS t(id, state, wamid, next_at, error, code, sent_at, counted, maybe_sent, refusal),
     (SELECT clock_timestamp() AS now) c
WHERE o.id = t.id AND o.state = 'sending';

-- name: outbox_expire_sending
-- A row left 'sending' past the lease belongs to a sender that died mid-request: its fate is
-- unknown, and the attempt may have reached the provider ($4: Tenashi's key window, seconds).
UPDATE outbox
SET state = 'unknown', unknown_at = to_timestamp($1::float8),
    ambiguous_at = coalesce(ambiguous_at, sending_at),
    retry_until = CASE WHEN provider = 'tenashi'
                       THEN coalesce(retry_until, (sending_at AT TIME ZONE 'UTC' + make_interval(secs => $4::float8))
                                                  AT TIME ZONE 'UTC')
                       ELSE retry_until END,
    last_error = 'sender stopped while sending', updated_at = c.now
FROM (SELECT clock_timestamp() AS now) c
WHERE id IN (
    SELECT id FROM outbox
    WHERE state = 'sending' AND sending_at <= to_timestamp($1::float8) - make_interval(secs => $2::float8)
    LIMIT $3
    FOR UPDATE SKIP LOCKED)
RETURNING id;

-- name: outbox_unknown_due
-- Unknown rows past the window ($1 now, epoch seconds; $2 the window, seconds), oldest first,
-- each with the span of webhooks it waits for: every webhook received
-- from the row's creation to the end of its window (created_at .. unknown_at + $2) must be
-- processed before the row follows its policy (a status that proves delivery may sit
-- unprocessed, and resending then sends twice).
SELECT o.id, o.created_at AS since, o.unknown_at + make_interval(secs => $2::float8) AS until
FROM outbox o
WHERE o.state = 'unknown' AND o.unknown_at <= to_timestamp($1::float8) - make_interval(secs => $2::float8)
ORDER BY o.unknown_at;

-- name: outbox_unknown_blockers
-- For unknown rows ($1 ids, $2 .. $3 the spans of outbox_unknown_due; $4 .. $5 the spans'
-- union), what each waits for: the oldest webhook in its span not processed yet (consumers
-- behind, or moved aside: inbox_unprocessed) or processed but for a status that failed on its
-- own or a fragment we could not parse (dead_events), and whether any of it is dead (an
-- operator must replay or drop it). Rows that wait for nothing are not returned. Its own
-- statement, apart from the outbox's: on a Citus coordinator a statement that reads the outbox
-- runs whole on the outbox's worker, and inbox_unprocessed's reads of the inbox's shards from
-- there are refused.
SELECT c.id, min(u.received_at) AS oldest, count(*) FILTER (WHERE u.state = 'dead') AS dead
FROM unnest($1::bigint[], $2::timestamptz[], $3::timestamptz[]) AS c(id, since, until)
JOIN (
    SELECT w.received_at, w.state FROM inbox_unprocessed() w
    WHERE w.received_at >= $4 AND w.received_at <= $5
    UNION ALL
    SELECT d.received_at, d.state FROM dead_events d
    WHERE d.state IN ('retry', 'dead') AND d.kind IN ('status', 'bad')
      AND d.received_at >= $4 AND d.received_at <= $5
) u ON u.received_at >= c.since AND u.received_at <= c.until
GROUP BY c.id;

-- name: outbox_reconcile_unknown
-- The rows $1 (outbox_unknown_due's that wait for nothing) follow their policy if still
-- unknown: 'resend' goes back to pending once, everything else to review; $2 now (epoch
-- seconds). A row that has a wamid or any delivery status reached the provider: never back to
-- pending. (The clock is read in a sub-select: Citus refuses a volatile function in an UPDATE.)
UPDATE outbox
SET state = CASE WHEN unknown_policy = 'resend' AND NOT resent AND wamid IS NULL
                      AND delivery_status IS NULL THEN 'pending' ELSE 'review' END,
    resent = resent OR (unknown_policy = 'resend' AND wamid IS NULL AND delivery_status IS NULL),
    next_attempt_at = to_timestamp($2::float8),
    updated_at = c.now
FROM (SELECT clock_timestamp() AS now) c
WHERE outbox.id IN (
    SELECT o.id FROM outbox o
    WHERE o.id = ANY ($1::bigint[]) AND o.state = 'unknown'
    ORDER BY o.unknown_at
    FOR UPDATE SKIP LOCKED)
RETURNING outbox.id, outbox.tenant, outbox.idem_key, outbox.state;

-- name: outbox_count_open
-- The states that drain, each counted on its own partial index up to a cap ($1): a gauge of
-- the backlog, never a scan of the whole table (accepted and cancelled rows, the bulk, are
-- counted as they happen by gateway_sends_total).
SELECT 'pending' AS state, (SELECT count(*) FROM (SELECT FROM outbox WHERE state = 'pending' LIMIT $1) x) AS n
UNION ALL
SELECT 'sending', (SELECT count(*) FROM (SELECT FROM outbox WHERE state = 'sending' LIMIT $1) x)
UNION ALL
SELECT 'unknown', (SELECT count(*) FROM (SELECT FROM outbox WHERE state = 'unknown' LIMIT $1) x)
UNION ALL
SELECT 'review', (SELECT count(*) FROM (SELECT FROM outbox WHERE state = 'review' LIMIT $1) x)
UNION ALL
SELECT 'failed', (SELECT count(*) FROM (SELECT FROM outbox WHERE state = 'failed' LIMIT $1) x);

-- name: outbox_oldest_unknown
SELECT extract(epoch FROM min(unknown_at))::float8 FROM outbox WHERE state = 'unknown';

-- name: outbox_list_state
SELECT tenant, idem_key, state, recipient, attempts, last_error_code, last_error, updated_at
FROM outbox
WHERE state = $1
ORDER BY updated_at, id
LIMIT $2;

-- name: outbox_tenants_for_key
SELECT tenant, state FROM outbox WHERE idem_key = $1 AND ($2::text IS NULL OR tenant = $2) ORDER BY tenant;

-- name: outbox_release
-- An operator's decision to send (again): attempts restart. Never a row that has a wamid or a
-- delivery status: the provider accepted it, and a release would send it twice. Nor one past
-- its retry_until (Tenashi no longer knows its key: a retry could send it twice). Nor an
-- unknown row inside its reconcile window ($3 seconds from unknown_at: its status may still
-- come), unless the operator accepts that it may be sent twice ($4). Nor a review or unknown
-- row while a webhook received since its creation is unprocessed (pending or dead): its
-- status may be among them.
-- $5: the newest unprocessed webhook's receipt (outbox_unprocessed_latest, read first in the
-- same transaction; NULL: none): a row created after it waits for none. (The clock is read once
-- in a sub-select and compared with immutable arithmetic: see outbox_record_results.)
UPDATE outbox o
SET state = 'pending', attempts = 0, next_attempt_at = c.now, updated_at = c.now
FROM (SELECT clock_timestamp() AS now) c
WHERE o.tenant = $1 AND o.idem_key = $2 AND o.state IN ('review', 'unknown', 'failed')
  AND o.wamid IS NULL AND o.delivery_status IS NULL
  AND (o.retry_until IS NULL OR o.retry_until > c.now)
  AND (o.state <> 'unknown' OR $4::bool
       OR c.now - coalesce(o.unknown_at, o.updated_at) >= make_interval(secs => $3::float8))
  AND (o.state = 'failed' OR (($5::timestamptz IS NULL OR $5::timestamptz < o.created_at)
    AND NOT EXISTS (
      SELECT 1 FROM dead_events d
      WHERE d.state IN ('retry', 'dead') AND d.kind IN ('status', 'bad') AND d.received_at >= o.created_at)))
RETURNING o.state;

-- name: outbox_unprocessed_latest
-- When the newest webhook not processed yet was received (NULL: none): what an operator's
-- release of a row created before it waits for (outbox_release, outbox_release_bulk). Its own
-- statement: on a Citus coordinator a statement that also reads the outbox runs whole on the
-- outbox's worker, and inbox_unprocessed's reads of the inbox's shards from there are refused
-- ("cannot execute a distributed query from a query on a shard").
SELECT inbox_unprocessed_latest();

-- name: outbox_unprocessed_since
-- Webhooks received since a row's creation ($1) that are not processed: (pending, dead), whole
-- rows and status events that failed on their own (dead_events: retrying counts as pending).
-- (The row's creation comes from the caller, as outbox_unprocessed_latest says why.)
SELECT count(*) FILTER (WHERE u.state IN ('pending', 'retry')) AS pending,
       count(*) FILTER (WHERE u.state = 'dead') AS dead
FROM (
    SELECT w.state FROM inbox_unprocessed() w
    WHERE w.received_at >= $1::timestamptz
    UNION ALL
    SELECT d.state FROM dead_events d
    WHERE d.state IN ('retry', 'dead') AND d.kind IN ('status', 'bad')
      AND d.received_at >= $1::timestamptz
) u;

-- name: outbox_cancel
UPDATE outbox o
SET state = 'cancelled', updated_at = c.now
FROM (SELECT clock_timestamp() AS now) c
WHERE o.tenant = $1 AND o.idem_key = $2 AND o.state IN ('pending', 'review', 'unknown', 'failed')
RETURNING o.state;

-- name: outbox_release_bulk
-- Every row in state $1 (review, unknown or failed), last changed in [$2, $3), of tenant $4
-- (NULL: any): released unless it has a wamid or a delivery status, or its retry_until passed
-- (Tenashi's key window: counted as refused).
-- Unknown rows inside their reconcile window ($5 seconds from unknown_at) are not released
-- unless $6 (counted as early, with the first and last moment one of them may be released;
-- released_early: how many were released inside it because of $6).
-- Review and unknown rows wait while a webhook received since their creation is unprocessed
-- (counted as waiting), as for one row: $7 as outbox_release's $5. (The clock is read once, in c.)
WITH c AS MATERIALIZED (
    SELECT clock_timestamp() AS now
), picked AS (
    SELECT o.id, (o.wamid IS NULL AND o.delivery_status IS NULL
                  AND (o.retry_until IS NULL OR o.retry_until > c.now)) AS safe,
           coalesce(o.unknown_at, o.updated_at) + make_interval(secs => $5::float8) AS releasable_at,
           (o.state = 'unknown'
            AND coalesce(o.unknown_at, o.updated_at) + make_interval(secs => $5::float8) > c.now)
             AS inside,
           (o.state <> 'failed' AND (coalesce($7::timestamptz >= o.created_at, false)
             OR EXISTS (
               SELECT 1 FROM dead_events d
               WHERE d.state IN ('retry', 'dead') AND d.kind IN ('status', 'bad')
                 AND d.received_at >= o.created_at))) AS waits
    FROM outbox o, c
    WHERE o.state = $1 AND o.state IN ('review', 'unknown', 'failed')
      AND ($2::float8 IS NULL OR o.updated_at >= to_timestamp($2::float8))
      AND ($3::float8 IS NULL OR o.updated_at < to_timestamp($3::float8))
      AND ($4::text IS NULL OR o.tenant = $4)
    FOR UPDATE OF o SKIP LOCKED
), upd AS (
    UPDATE outbox o
    SET state = 'pending', attempts = 0, next_attempt_at = c.now, updated_at = c.now
    FROM picked p, c
    WHERE o.id = p.id AND p.safe AND (NOT p.inside OR $6::bool) AND NOT p.waits
    RETURNING o.id
)
SELECT (SELECT count(*) FROM upd) AS done, (SELECT count(*) FROM picked WHERE NOT safe) AS refused,
       (SELECT count(*) FROM picked WHERE safe AND (NOT inside OR $6::bool) AND waits) AS waiting,
       (SELECT count(*) FROM picked WHERE safe AND inside AND NOT $6::bool) AS early,
       (SELECT min(releasable_at) FROM picked WHERE safe AND inside AND NOT $6::bool) AS early_first,
       (SELECT max(releasable_at) FROM picked WHERE safe AND inside AND NOT $6::bool) AS early_last,
       (SELECT count(*) FROM upd JOIN picked USING (id) WHERE picked.inside) AS released_early;

-- name: outbox_cancel_bulk
WITH upd AS (
    UPDATE outbox
    SET state = 'cancelled', updated_at = c.now
    FROM (SELECT clock_timestamp() AS now) c
    WHERE id IN (
        SELECT id FROM outbox
        WHERE state = $1 AND state IN ('pending', 'review', 'unknown', 'failed')
          AND ($2::float8 IS NULL OR updated_at >= to_timestamp($2::float8))
          AND ($3::float8 IS NULL OR updated_at < to_timestamp($3::float8))
          AND ($4::text IS NULL OR tenant = $4)
        FOR UPDATE SKIP LOCKED)
    RETURNING id
)
SELECT (SELECT count(*) FROM upd) AS done, 0::bigint AS refused, 0::bigint AS waiting;
