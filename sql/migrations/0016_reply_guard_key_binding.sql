-- The reply guard per tenant, Idempotency-Keys bound to their body for as long as their outbox
-- row lives, and the moment a send first may have reached its provider.

-- The body an outbox row was made from (the send API's fingerprint, gateway/core/messages.py):
-- a key whose idempotency record expired is still bound to it while the row exists. NULL for
-- rows not made by the send API (handler replies).
ALTER TABLE outbox ADD COLUMN fingerprint text;
-- How often a key freed by a permanent rejection was used again for a new send: each
-- generation has its own callback data (and Tenashi Idempotency-Key), so the provider never
-- answers the new send with the old one's refusal.
ALTER TABLE outbox ADD COLUMN generation integer NOT NULL DEFAULT 0;
-- The first attempt whose outcome left open whether the provider acted on it (a timeout, a
-- lost connection, a 5xx, Tenashi's 409 in progress, a sender that died mid-request), and, for
-- Tenashi, the last moment a retry may still go: Tenashi honours an Idempotency-Key for 24 hours,
-- past that a retry would send again (GATEWAY_TENASHI_KEY_WINDOW_H after the first such attempt;
-- set by the sender and the reconciler, checked by every claim and every release).
ALTER TABLE outbox ADD COLUMN ambiguous_at timestamptz;
ALTER TABLE outbox ADD COLUMN retry_until timestamptz;

-- The reply guard: by default one reply per inbound message, whoever answers and under
-- whichever bot name. A tenant allowed several bots (GATEWAY_REPLY_PER_BOT_TENANTS) may answer
-- once per bot, as long as no other tenant answered first. Claimants of one message queue on a
-- transaction advisory lock (namespace 0x67777270, "gwrp"; the second key a hash of the wamid),
-- so the check and the insert are one step; a rollback releases the claim with the lock.
-- Returns nothing when the claim is ours, else the claim that stands in the way.
-- Superseded: the current source is sql/functions/reply_claim.sql (this body is kept as released).
CREATE FUNCTION reply_claim(p_wamid text, p_bot text, p_tenant text, p_key text, p_per_bot boolean)
RETURNS TABLE (holder_tenant text, holder_bot text, holder_key text)
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(1735881328, hashtext(p_wamid));
    RETURN QUERY
        SELECT c.tenant, c.claimed_by, c.idem_key
        FROM reply_claims c
        WHERE c.inbound_wamid = p_wamid
          AND (NOT p_per_bot OR c.tenant IS DISTINCT FROM p_tenant OR c.claimed_by = p_bot)
        ORDER BY c.claimed_at
        LIMIT 1;
    IF NOT FOUND THEN
        INSERT INTO reply_claims (inbound_wamid, claimed_by, tenant, idem_key)
        VALUES (p_wamid, p_bot, p_tenant, p_key);
    END IF;
END;
$$;

-- For SQL callers: true the first time a message is claimed, false once anyone answered it.
-- Superseded: the current source is sql/functions/claim_reply.sql (this body is kept as released).
CREATE OR REPLACE FUNCTION claim_reply(p_inbound_wamid text, p_claimed_by text) RETURNS boolean
LANGUAGE sql AS $$
    SELECT NOT EXISTS (SELECT 1 FROM reply_claim(p_inbound_wamid, p_claimed_by, NULL, NULL, false));
$$;

-- A dead item is unique per (row, fragment, key) on a hash of the key: the key itself may be
-- too large for an index row (a 3 200-character message id, SQLSTATE 54000), and such an event
-- must still be recorded as the dead item it is.
DROP INDEX dead_events_item;
CREATE UNIQUE INDEX dead_events_item ON dead_events (inbox_id, path, md5(coalesce(event_key, '')));
