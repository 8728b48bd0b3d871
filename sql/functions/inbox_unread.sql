-- The rows of webhook_inbox no lane's cursor has read yet (dead or retried whole webhooks are
-- in inbox_parked). One scan of webhook_inbox_log from where unread rows can start (the least
-- xmax of the lanes' done snapshots, and the transactions those snapshots saw in progress),
-- each row judged by its own lane's cursor. For gauges, the console, the reconciler and
-- retention: the consumers read by lanes (inbox_read).
CREATE OR REPLACE FUNCTION inbox_unread()
RETURNS TABLE (id bigint, received_at timestamptz, lane smallint, txid xid8)
LANGUAGE sql STABLE AS $$
    WITH c AS MATERIALIZED (
        SELECT l.lane, l.done_snap, l.win_snap, l.pos_txid, l.pos_id FROM inbox_lanes l
    ), lo AS MATERIALIZED (
        SELECT min(pg_snapshot_xmax(done_snap)) AS lo,
               coalesce(array_agg(DISTINCT x) FILTER (WHERE x IS NOT NULL), '{}') AS running
        FROM c LEFT JOIN LATERAL pg_snapshot_xip(c.done_snap) AS x ON true
    )
    SELECT w.id, w.received_at, w.lane, w.txid
    FROM (
        SELECT w.id, w.received_at, w.lane, w.txid FROM webhook_inbox w
        WHERE w.txid >= (SELECT lo FROM lo)
        UNION ALL
        SELECT w.id, w.received_at, w.lane, w.txid FROM webhook_inbox w
        WHERE w.txid = ANY ((SELECT running FROM lo)::xid8[]) AND w.txid < (SELECT lo FROM lo)
    ) w
    JOIN c ON c.lane = w.lane
    WHERE NOT pg_visible_in_snapshot(w.txid, c.done_snap)
      AND NOT (c.win_snap IS NOT NULL AND pg_visible_in_snapshot(w.txid, c.win_snap)
               AND (w.txid, w.id) <= (c.pos_txid, c.pos_id));
$$;
