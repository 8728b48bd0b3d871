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
