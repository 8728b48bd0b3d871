-- When the oldest row no lane's cursor has read yet was received (NULL: none). Each lane's
-- first unread row in its reading order (transactions in commit order: its received_at is
-- within one transaction's length of the lane's oldest), found by an ordered walk of the log
-- index from the lane's cursor that stops at the first row: a backlog is never read whole.
-- For the lag gauge and the console.
CREATE OR REPLACE FUNCTION inbox_oldest_unread() RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT min(f.received_at)
    FROM inbox_lanes c
    CROSS JOIN LATERAL (
        (SELECT w.received_at FROM webhook_inbox w
         WHERE w.txid >= pg_snapshot_xmax(c.done_snap) AND w.lane = c.lane
           AND NOT (c.win_snap IS NOT NULL AND pg_visible_in_snapshot(w.txid, c.win_snap)
                    AND (w.txid, w.id) <= (c.pos_txid, c.pos_id))
         ORDER BY w.txid, w.id LIMIT 1)
        UNION ALL
        (SELECT w.received_at FROM webhook_inbox w
         WHERE w.txid = ANY (ARRAY(SELECT pg_snapshot_xip(c.done_snap))) AND w.lane = c.lane
           AND NOT (c.win_snap IS NOT NULL AND pg_visible_in_snapshot(w.txid, c.win_snap)
                    AND (w.txid, w.id) <= (c.pos_txid, c.pos_id))
         ORDER BY w.txid, w.id LIMIT 1)
    ) f;
$$;
