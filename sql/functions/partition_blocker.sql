-- A transaction that has held a lock on `rel` (or one of its partitions) for more than `held`:
-- its pid and since when (NULL: none). A DDL that needs the table queued behind it would hold
-- up every writer queued behind the DDL, so the job skips that step and says who is in the way.
CREATE OR REPLACE FUNCTION partition_blocker(rel text, held interval, OUT pid int, OUT since timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT a.pid, a.xact_start
    FROM pg_locks l
    JOIN pg_stat_activity a ON a.pid = l.pid
    WHERE l.locktype = 'relation' AND l.granted AND a.pid <> pg_backend_pid()
      AND a.xact_start < now() - held
      AND (l.relation = rel::regclass
           OR l.relation IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = rel::regclass))
    ORDER BY a.xact_start
    LIMIT 1;
$$;
