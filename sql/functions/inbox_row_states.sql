-- What became of each staged webhook received in [since, until): 'pending' (no lane's cursor
-- has read it), 'retry' or 'dead' (moved aside, inbox_parked), else 'done'. A scan of those
-- days: for operators, tests and the load harness's checks, not for a hot path.
CREATE OR REPLACE FUNCTION inbox_row_states(since timestamptz DEFAULT '-infinity', until timestamptz DEFAULT 'infinity')
RETURNS TABLE (id bigint, received_at timestamptz, state text)
LANGUAGE sql STABLE AS $$
    SELECT w.id, w.received_at,
           CASE WHEN p.state IN ('retry', 'dead') THEN p.state
                WHEN u.id IS NOT NULL THEN 'pending'
                ELSE 'done' END
    FROM webhook_inbox w
    LEFT JOIN inbox_parked p ON p.inbox_id = w.id
    LEFT JOIN (SELECT u.id FROM inbox_unread() u) u ON u.id = w.id
    WHERE w.received_at >= since AND w.received_at < until;
$$;
