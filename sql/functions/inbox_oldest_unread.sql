-- When the oldest row no lane's cursor has read yet was received (NULL: none): the first
-- unread row in the lanes' reading order, (txid, id) (transactions in commit order: its
-- received_at is within one transaction's length of the oldest). One ordered walk of the log
-- index from where unread rows start (as inbox_read, over every lane), stopped at the first
-- unread row: a backlog is never read whole, for which the walk must not be a sort. For the
-- lag gauge and the console.
CREATE OR REPLACE FUNCTION inbox_oldest_unread() RETURNS timestamptz
LANGUAGE sql STABLE SET enable_sort = off AS $$
    WITH c AS MATERIALIZED (
        SELECT array_agg(l.done_snap ORDER BY l.lane) AS dones,
               array_agg(l.win_snap ORDER BY l.lane) AS wins,
               array_agg(l.pos_txid ORDER BY l.lane) AS ptx,
               array_agg(l.pos_id ORDER BY l.lane) AS pid
        FROM inbox_lanes l
    ), s AS MATERIALIZED (
        SELECT k.t, k.i FROM (
            SELECT CASE WHEN l.win_snap IS NOT NULL THEN l.pos_txid
                        ELSE (pg_snapshot_xmax(l.done_snap)::text::numeric - 1)::text::xid8 END AS t,
                   CASE WHEN l.win_snap IS NOT NULL THEN l.pos_id ELSE 9223372036854775807 END AS i
            FROM inbox_lanes l) k
        ORDER BY k.t, k.i LIMIT 1
    ), x AS MATERIALIZED (
        SELECT coalesce(array_agg(DISTINCT r), '{}') AS running
        FROM inbox_lanes l, pg_snapshot_xip(l.done_snap) AS r
        WHERE l.win_snap IS NULL AND r <= (SELECT t FROM s)
    )
    SELECT min(f.received_at) FROM (
        (SELECT w.received_at FROM webhook_inbox w
         -- (the txid bound is the index's; a row comparison against sub-selects is not)
         WHERE w.txid >= (SELECT t FROM s) AND (w.txid, w.id) > ((SELECT t FROM s), (SELECT i FROM s))
           AND NOT pg_visible_in_snapshot(w.txid, ((SELECT dones FROM c))[w.lane + 1])
           AND NOT (((SELECT wins FROM c))[w.lane + 1] IS NOT NULL
                    AND pg_visible_in_snapshot(w.txid, ((SELECT wins FROM c))[w.lane + 1])
                    AND (w.txid, w.id) <= (((SELECT ptx FROM c))[w.lane + 1], ((SELECT pid FROM c))[w.lane + 1]))
         ORDER BY w.txid, w.id LIMIT 1)
        UNION ALL
        (SELECT w.received_at FROM webhook_inbox w
         WHERE w.txid = ANY ((SELECT running FROM x)::xid8[])
           AND (w.txid, w.id) <= ((SELECT t FROM s), (SELECT i FROM s))
           AND NOT pg_visible_in_snapshot(w.txid, ((SELECT dones FROM c))[w.lane + 1])
         ORDER BY w.txid, w.id LIMIT 1)
    ) f;
$$;
