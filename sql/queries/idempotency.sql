-- Idempotency keys of the send API.

-- name: idempotency_keys_claim
-- Atomic claim. Takes over only:
-- - an expired key (not yet purged), unless its outbox row still exists for another body: a
--   key stays bound to its body for as long as its row exists (so the same key with another
--   body is a 422, never a 2xx that sends nothing);
-- - a claim left in_progress past its lease by a crashed request with the same body;
-- - a key whose send was refused for good by the provider (its row is failed: nothing was
--   sent), which frees it for a corrected retry.
INSERT INTO idempotency_keys AS k (tenant, key, fingerprint, expires_at)
VALUES ($1, $2, $3, clock_timestamp() + make_interval(hours => $4::int))
ON CONFLICT (tenant, key) DO UPDATE
SET fingerprint = EXCLUDED.fingerprint,
    state = 'in_progress',
    response_status = NULL,
    response_headers = NULL,
    response_body = NULL,
    created_at = clock_timestamp(),
    locked_at = clock_timestamp(),
    expires_at = EXCLUDED.expires_at
WHERE (k.expires_at <= clock_timestamp()
       AND NOT EXISTS (
           SELECT 1 FROM outbox o
           WHERE o.tenant = k.tenant AND o.idem_key = k.key AND o.state <> 'failed'
             AND o.fingerprint IS DISTINCT FROM EXCLUDED.fingerprint))
   OR (k.state = 'in_progress'
       AND k.locked_at <= clock_timestamp() - make_interval(secs => $5::float8)
       AND k.fingerprint = EXCLUDED.fingerprint)
   OR (k.state = 'done'
       AND EXISTS (SELECT 1 FROM outbox o
                   WHERE o.tenant = k.tenant AND o.idem_key = k.key AND o.state = 'failed'))
RETURNING true;

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
