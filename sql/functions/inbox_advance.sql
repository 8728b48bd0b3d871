-- The lanes' cursors move as a consumer batch read them, in the batch's transaction: each
-- element of `cursors` names a lane, the version its cursor must still have, and where it goes
-- (done snapshot; window snapshot and position, or NULL). Only the lanes' owner `member` may
-- move them: a lane taken over by another member, or moved by anyone since it was read, makes
-- the whole transaction fail (SQLSTATE GWL01), so a stale owner's batch commits nothing.
CREATE OR REPLACE FUNCTION inbox_advance(member text, cursors jsonb) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    moved integer;
BEGIN
    UPDATE inbox_lanes l SET
        done_snap = c.done::pg_snapshot,
        win_snap = c.win::pg_snapshot,
        pos_txid = c.pos_txid::text::xid8,
        pos_id = c.pos_id,
        version = l.version + 1,
        advanced_at = t.now
    FROM jsonb_to_recordset(cursors) AS c(lane smallint, version bigint, done text, win text,
                                          pos_txid bigint, pos_id bigint),
         -- (the clock read in a sub-select: Citus refuses a volatile function in an UPDATE of
         -- a distributed table)
         (SELECT clock_timestamp() AS now) t
    WHERE l.lane = c.lane AND l.owner = member AND l.version = c.version;
    GET DIAGNOSTICS moved = ROW_COUNT;
    IF moved <> jsonb_array_length(cursors) THEN
        RAISE EXCEPTION 'lane cursor moved or lane taken over (% of % lanes still as read by %)',
            moved, jsonb_array_length(cursors), member
            USING ERRCODE = 'GWL01';
    END IF;
    RETURN moved;
END;
$$;
