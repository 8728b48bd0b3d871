-- Cluster-wide pacing keys and circuit breakers of the senders. A number's keys (its own and
-- its pairs') are read and written only while holding the advisory lock of the number key,
-- a breaker only under the lock of its own name (hashtextextended(name, 6006)), in the
-- transaction that claims or records the sends they pace.

-- name: pacing_try_lock
-- The keys this transaction now holds; a key another transaction holds is left out (no wait).
SELECT k FROM unnest($1::text[]) AS k WHERE pg_try_advisory_xact_lock(hashtextextended(k, 6006));

-- name: pacing_lock
-- Wait for the keys, in the order given (callers sort them, so two waiters never deadlock).
SELECT count(pg_advisory_xact_lock(hashtextextended(k, 6006))) FROM unnest($1::text[]) AS k;

-- name: pacing_get
SELECT key, at FROM send_pacing WHERE key = ANY($1::text[]);

-- name: pacing_put
-- (The clock is read in the SELECT: Citus refuses a volatile function in DO UPDATE SET, as
-- send_pacing is a reference table there.)
INSERT INTO send_pacing (key, at, updated_at)
SELECT t.key, t.at, clock_timestamp() FROM unnest($1::text[], $2::float8[]) AS t(key, at)
ON CONFLICT (key) DO UPDATE SET at = excluded.at, updated_at = excluded.updated_at;

-- name: pacing_purge
-- Keys whose time passed long ago pace nothing (absent means "now"). Rows a claim holds are
-- skipped (the purge never waits for a claim, so the two cannot deadlock), and `at < $1` is
-- checked again on the latest version, so a freshly booked key is never deleted.
DELETE FROM send_pacing
WHERE key IN (
    SELECT key FROM send_pacing WHERE at < $1::float8 ORDER BY at LIMIT $2 FOR UPDATE SKIP LOCKED)
  AND at < $1::float8;

-- name: breakers_get
SELECT b.scope, b.provider, b.key, b.state, b.failures, b.retry_at, b.code, b.error, b.probe_id
FROM send_breakers b
JOIN unnest($1::text[], $2::text[], $3::text[]) AS t(scope, provider, key)
  ON (b.scope, b.provider, b.key) = (t.scope, t.provider, t.key)
WHERE b.state <> 'closed';

-- name: breakers_put
-- (The clock is read once in a sub-select and only assigned: Citus refuses volatile functions
-- in DO UPDATE SET and in CASE, as send_breakers is a reference table there; an opening's
-- excluded.opened_at is that reading.)
INSERT INTO send_breakers (scope, provider, key, state, failures, retry_at, code, error, probe_id, opened_at,
                           updated_at)
SELECT t.scope, t.provider, t.key, t.state, t.failures, t.retry_at, t.code, t.error, t.probe_id,
       CASE WHEN t.state = 'open' THEN c.now END, c.now
FROM (SELECT clock_timestamp() AS now) c,
     unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::int[], $6::float8[], $7::int[],
            $8::text[], $9::bigint[]) AS t(scope, provider, key, state, failures, retry_at, code, error, probe_id)
ON CONFLICT (scope, provider, key) DO UPDATE SET
    state = excluded.state, failures = excluded.failures, retry_at = excluded.retry_at,
    code = coalesce(excluded.code, send_breakers.code), error = coalesce(excluded.error, send_breakers.error),
    probe_id = excluded.probe_id,
    opened_at = CASE WHEN excluded.state = 'open' AND send_breakers.state <> 'open'
                     THEN excluded.opened_at ELSE send_breakers.opened_at END,
    updated_at = excluded.updated_at;

-- name: breakers_list
SELECT scope, provider, key, state, failures, code, error, opened_at, retry_at, probe_id, updated_at
FROM send_breakers
ORDER BY scope, provider, key;

-- name: breakers_wake_rows
-- A breaker closed: its rows that were put off until the probe time are due now. A number's
-- breaker holds that number's rows; a token's, rows of every number that uses the token: all
-- put-off rows of the provider are due (the next claim puts off again what is still held).
-- (The clock is read in a sub-select: a Citus coordinator refuses a volatile function in an
-- UPDATE of a distributed table.)
UPDATE outbox
SET next_attempt_at = to_timestamp($4::float8), updated_at = c.now
FROM (SELECT clock_timestamp() AS now) c
WHERE state = 'pending' AND next_attempt_at > to_timestamp($4::float8) AND provider = $2
  AND ($1::text <> 'number' OR phone_number_id = $3);
