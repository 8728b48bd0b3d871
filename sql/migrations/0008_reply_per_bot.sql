-- One reply per inbound message *per bot* (was: per message). Two bots (say an order bot and
-- a survey bot) may each answer a customer's message once; the same bot never twice.
-- A claim made through the send API also records the reply's tenant and Idempotency-Key, so a
-- second reply can be answered with 409 naming the first.
ALTER TABLE reply_claims DROP CONSTRAINT reply_claims_pkey;
ALTER TABLE reply_claims ADD PRIMARY KEY (inbound_wamid, claimed_by);
ALTER TABLE reply_claims ADD COLUMN tenant text;
ALTER TABLE reply_claims ADD COLUMN idem_key text;

-- Same signature and meaning for its callers: true once per (wamid, bot), false after.
-- Superseded: the current source is sql/functions/claim_reply.sql (this body is kept as released).
CREATE OR REPLACE FUNCTION claim_reply(p_inbound_wamid text, p_claimed_by text) RETURNS boolean
LANGUAGE sql AS $$
    WITH ins AS (
        INSERT INTO reply_claims (inbound_wamid, claimed_by)
        VALUES (p_inbound_wamid, p_claimed_by)
        ON CONFLICT (inbound_wamid, claimed_by) DO NOTHING
        RETURNING 1
    )
    SELECT EXISTS (SELECT 1 FROM ins);
$$;
