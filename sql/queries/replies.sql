-- The reply guard (sql/functions/reply_claim.sql): one reply per inbound message, or one per
-- bot for tenants that opted in. Claimed in the transaction that enqueues the reply, so a
-- rollback releases the claim.

-- name: reply_claims_claim
-- No row: the claim is ours. A row: the claim that stands in the way (its tenant, bot, key).
SELECT holder_tenant, holder_bot, holder_key FROM reply_claim($1, $2, $3, $4, $5);

-- name: reply_claims_release_key
-- A key used again for a new send (its first send was refused for good) gives up its claims.
DELETE FROM reply_claims WHERE tenant = $1 AND idem_key = $2;

-- name: reply_claims_received_on
-- The numbers an inbound message was received on (a wamid can be stored more than once: once
-- per source, or again after Meta's redelivery window).
SELECT DISTINCT phone_number_id FROM inbound_messages WHERE wamid = $1;

-- name: reply_recipient_matches
-- Whether $2, the recipient of a reply to inbound message $1, names the customer who wrote it:
-- their phone number, BSUID or parent BSUID as the message named them, or one the gateway has
-- seen with them on the same business number (customer_ids). No row: the message is not known
-- (not received, or older than the feed keeps).
SELECT coalesce($2::text IN (m.sender, m.user_id, m.parent_user_id), false)
       OR EXISTS (SELECT 1 FROM customer_ids c
                  WHERE c.phone_number_id = m.phone_number_id
                    AND (c.user_id = m.user_id OR c.wa_id = m.sender OR c.parent_user_id = m.parent_user_id)
                    AND $2::text IN (c.user_id, c.wa_id, c.parent_user_id)) AS matches,
       m.phone_number_id
FROM inbound_messages m
WHERE m.wamid = $1
ORDER BY m.received_at DESC
LIMIT 1;
