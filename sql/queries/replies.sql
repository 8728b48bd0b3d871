-- The reply guard: at most one reply per (inbound wamid, bot). Claimed in the transaction that
-- enqueues the reply, so a rollback releases the claim. A concurrent claimant of the same pair
-- waits on the unique index until the first commits (then gets nothing) or rolls back (then wins).

-- name: reply_claims_claim
INSERT INTO reply_claims (inbound_wamid, claimed_by, tenant, idem_key)
VALUES ($1, $2, $3, $4)
ON CONFLICT (inbound_wamid, claimed_by) DO NOTHING
RETURNING inbound_wamid;

-- name: reply_claims_get
SELECT inbound_wamid, claimed_by, tenant, idem_key, claimed_at
FROM reply_claims
WHERE inbound_wamid = $1 AND claimed_by = $2;
