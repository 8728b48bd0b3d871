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

-- name: reply_recipient_matches
-- Whether $2, the recipient of a reply to inbound message $1, names the customer who wrote it:
-- their phone number, BSUID or parent BSUID as the message named them, or one the gateway has
-- seen with them on the same business number (customer_ids). No row: the message is not known
-- (not received, or older than the feed keeps).
SELECT coalesce($2::text IN (m.sender, m.user_id, m.parent_user_id), false)
       OR EXISTS (SELECT 1 FROM customer_ids c
                  WHERE c.phone_number_id = m.phone_number_id
                    AND (c.user_id = m.user_id OR c.wa_id = m.sender OR c.parent_user_id = m.parent_user_id)
                    AND $2::text IN (c.user_id, c.wa_id, c.parent_user_id)) AS matches
FROM inbound_messages m
WHERE m.wamid = $1
ORDER BY m.received_at DESC
LIMIT 1;

-- name: inbound_number
-- The business number inbound message $1 came to (read receipts go from that number).
SELECT phone_number_id FROM inbound_messages
WHERE wamid = $1 AND phone_number_id IS NOT NULL
ORDER BY received_at DESC
LIMIT 1;
