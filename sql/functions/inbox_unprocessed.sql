-- Staged webhooks not processed: no lane's cursor has read them, or they were moved aside and
-- wait for a retry ('pending'), or were parked for an operator ('dead'). What the reconciler
-- and an operator's release wait for: a status that proves a send may be among them.
CREATE OR REPLACE FUNCTION inbox_unprocessed()
RETURNS TABLE (id bigint, received_at timestamptz, state text)
LANGUAGE sql STABLE AS $$
    SELECT u.id, u.received_at, 'pending' FROM inbox_unread() u
    WHERE NOT EXISTS (SELECT 1 FROM inbox_parked p WHERE p.inbox_id = u.id)
    UNION ALL
    SELECT p.inbox_id, p.received_at, CASE p.state WHEN 'retry' THEN 'pending' ELSE 'dead' END
    FROM inbox_parked p WHERE p.state IN ('retry', 'dead');
$$;
