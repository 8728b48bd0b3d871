-- The oldest day partition of `parent` whose day is before `cutoff` (NULL: none), and
-- whether an interrupted DETACH ... CONCURRENTLY left it pending. The retention job detaches
-- it CONCURRENTLY (no lock that blocks writers) and drops the detached table; neither can run
-- inside a function, so the statements are in sql/queries/retention.sql.
CREATE OR REPLACE FUNCTION partition_oldest_before(
    parent text, cutoff date, OUT name text, OUT detach_pending boolean
) LANGUAGE sql STABLE AS $$
    SELECT c.relname::text, i.inhdetachpending
    FROM pg_inherits i
    JOIN pg_class c ON c.oid = i.inhrelid
    WHERE i.inhparent = parent::regclass
      AND c.relname ~ ('^' || parent || '_p[0-9]{8}$')
      AND to_date(right(c.relname, 8), 'YYYYMMDD') < cutoff
    ORDER BY c.relname
    LIMIT 1;
$$;
