-- When the newest webhook not processed yet was received (NULL: none): unread, moved aside or
-- dead (inbox_unprocessed). What an operator's release of an outbox row created before it waits
-- for. Planned by index whatever the caller's session, as inbox_pending_count says why (a
-- max over the unread rows otherwise reads today's whole inbox partition).
CREATE OR REPLACE FUNCTION inbox_unprocessed_latest() RETURNS timestamptz
LANGUAGE plpgsql STABLE SET enable_seqscan = off AS $$
BEGIN
    RETURN (SELECT max(u.received_at) FROM inbox_unprocessed() u);
END;
$$;
