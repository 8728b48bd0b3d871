-- The reply guard for SQL callers (a handler's own statements): true the first time a message
-- is claimed, false once anyone answered it. Claim in the transaction that enqueues the reply,
-- so a rollback releases the claim:
--   SELECT claim_reply('<inbound wamid>', '<bot name>');   -- true: yours; false: taken
-- The send API and gateway.handlers.reply use reply_claim, which also names the holder.
CREATE OR REPLACE FUNCTION claim_reply(p_inbound_wamid text, p_claimed_by text) RETURNS boolean
LANGUAGE sql AS $$
    SELECT NOT EXISTS (SELECT 1 FROM reply_claim(p_inbound_wamid, p_claimed_by, NULL, NULL, false));
$$;
