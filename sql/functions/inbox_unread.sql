-- The rows of webhook_inbox no lane's cursor has read yet (whole webhooks moved aside are in
-- inbox_parked). A scan of webhook_inbox_log from where unread rows can start (the least xmax
-- of the lanes' done snapshots, and the transactions those snapshots saw in progress), each row
-- judged by its own lane's cursor. A single SELECT, so that the planner inlines it and a
-- caller's LIMIT or EXISTS stops the scan early. For gauges, the console, the reconciler and
-- retention; the consumers read by lanes (inbox_read).
CREATE OR REPLACE FUNCTION inbox_unread()
RETURNS TABLE (id bigint, received_at timestamptz, lane smallint, txid xid8)
LANGUAGE sql STABLE AS $$
    SELECT w.id, w.received_at, w.lane, w.txid
    FROM (
        SELECT w.id, w.received_at, w.lane, w.txid FROM webhook_inbox w
        WHERE w.txid >= (SELECT min(pg_snapshot_xmax(l.done_snap)) FROM inbox_lanes l)
        UNION ALL
        SELECT w.id, w.received_at, w.lane, w.txid FROM webhook_inbox w
        WHERE w.txid = ANY (ARRAY(SELECT x FROM inbox_lanes l, pg_snapshot_xip(l.done_snap) AS x))
          AND w.txid < (SELECT min(pg_snapshot_xmax(l.done_snap)) FROM inbox_lanes l)
    ) w
    WHERE NOT EXISTS (
        SELECT 1 FROM inbox_lanes c
        WHERE c.lane = w.lane
          AND (pg_visible_in_snapshot(w.txid, c.done_snap)
               OR (c.win_snap IS NOT NULL AND pg_visible_in_snapshot(w.txid, c.win_snap)
                   AND (w.txid, w.id) <= (c.pos_txid, c.pos_id))));
$$;
