-- Idempotency keys of the send API.

-- name: idempotency_keys_claim
-- Atomic claim. Takes over only:
-- - an expired key (not yet purged), unless its outbox row still exists for another body: a
--   key stays bound to its body for as long as its row exists (so the same key with another
--   body is a 422, never a 2xx that sends nothing);
-- - a claim left in_progress past its lease by a crashed request with the same body;
-- - a key whose send was refused for good by the provider (its row is failed: nothing was
--   sent), which frees it for a corrected retry.
-- A new key is inserted; an existing one is taken over by the UPDATE, which locks it and
-- judges it as committed (a key inserted meanwhile by a concurrent request is in_progress and
-- fresh: neither could take it). Written as INSERT ... DO NOTHING + UPDATE rather than
-- ON CONFLICT DO UPDATE ... WHERE EXISTS (...): Citus refuses subqueries inside an INSERT.
WITH fresh AS (
    INSERT INTO idempotency_keys (tenant, key, fingerprint, expires_at)
    VALUES ($1, $2, $3, clock_timestamp() + make_interval(hours => $4::int))
    ON CONFLICT (tenant, key) DO NOTHING
    RETURNING true AS claimed
), taken AS (
    UPDATE idempotency_keys k
    SET fingerprint = $3,
        state = 'in_progress',
        response_status = NULL,
        response_headers = NULL,
        response_body = NULL,
        created_at = c.now,
        locked_at = c.now,
        expires_at = c.expires
    FROM (SELECT clock_timestamp() AS now,
                 clock_timestamp() - make_interval(secs => $5::float8) AS stale,
                 clock_timestamp() + make_interval(hours => $4::int) AS expires) c
    -- (a row the INSERT just made is not in this statement's snapshot: the UPDATE never sees it)
    WHERE k.tenant = $1 AND k.key = $2
      AND ((k.expires_at <= c.now
            AND NOT EXISTS (
                SELECT 1 FROM outbox o
                WHERE o.tenant = $1 AND o.idem_key = $2 AND o.state <> 'failed'
                  AND o.fingerprint IS DISTINCT FROM $3))
           OR (k.state = 'in_progress' AND k.locked_at <= c.stale AND k.fingerprint = $3)
           OR (k.state = 'done'
               AND EXISTS (SELECT 1 FROM outbox o
                           WHERE o.tenant = $1 AND o.idem_key = $2 AND o.state = 'failed')))
    RETURNING true AS claimed
)
SELECT claimed FROM fresh UNION ALL SELECT claimed FROM taken;

-- name: idempotency_keys_get
-- Expired keys too: one that could not be taken over is still bound to its body.
SELECT fingerprint, state, response_status, response_headers, response_body
FROM idempotency_keys
WHERE tenant = $1 AND key = $2;

-- name: idempotency_keys_complete
UPDATE idempotency_keys
SET state = 'done', response_status = $4, response_headers = $5, response_body = $6
WHERE tenant = $1 AND key = $2 AND fingerprint = $3 AND state = 'in_progress';

-- name: idempotency_keys_release
DELETE FROM idempotency_keys
WHERE tenant = $1 AND key = $2 AND fingerprint = $3 AND state = 'in_progress';

-- name: idempotency_keys_purge_expired
-- Bounded batch: short locks, called repeatedly.
DELETE FROM idempotency_keys
WHERE (tenant, key) IN (
    SELECT tenant, key FROM idempotency_keys
    WHERE expires_at <= clock_timestamp()
    LIMIT $1
    FOR UPDATE SKIP LOCKED);
