-- Staged webhooks waiting to be processed, counted up to cap: rows no lane's cursor has read
-- yet, and whole webhooks moved aside waiting for a retry (inbox_unprocessed's 'pending').
-- For the depth gauge and the console's overview: a bounded count at every refresh.
-- Planned by index whatever the caller's session (SET enable_seqscan = off): the lower bound
-- of inbox_unread() is a sub-select the planner guesses a third of the table from, and planned
-- on that guess the count reads today's whole inbox partition (78 ms at 500 000 rows, growing
-- with the day) instead of the few rows past the cursors. PL/pgSQL: Citus refuses to plan a
-- parameterized LANGUAGE sql function over distributed tables.
CREATE OR REPLACE FUNCTION inbox_pending_count(cap bigint) RETURNS bigint
LANGUAGE plpgsql STABLE SET enable_seqscan = off AS $$
BEGIN
    RETURN (SELECT count(*) FROM (SELECT 1 FROM inbox_unprocessed() u WHERE u.state = 'pending' LIMIT cap) x);
END;
$$;
