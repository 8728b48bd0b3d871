-- The reply guard: by default one reply per inbound message, whoever answers and under
-- whichever bot name. A tenant allowed several bots (GATEWAY_REPLY_PER_BOT_TENANTS) may answer
-- once per bot, as long as no other tenant answered first. Claimants of one message queue on a
-- transaction advisory lock (namespace 0x67777270, "gwrp"; the second key a hash of the wamid),
-- so the check and the insert are one step; a rollback releases the claim with the lock.
-- Returns nothing when the claim is ours, else the claim that stands in the way.
CREATE OR REPLACE FUNCTION reply_claim(p_wamid text, p_bot text, p_tenant text, p_key text, p_per_bot boolean)
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
