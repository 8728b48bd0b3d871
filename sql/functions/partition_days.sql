-- The days of `parent`'s day partitions, oldest first (the sentinel partition is not a day).
CREATE OR REPLACE FUNCTION partition_days(parent text) RETURNS SETOF date
LANGUAGE sql STABLE AS $$
    SELECT to_date(right(c.relname, 8), 'YYYYMMDD') AS day
    FROM pg_inherits i
    JOIN pg_class c ON c.oid = i.inhrelid
    WHERE i.inhparent = parent::regclass
      AND c.relname ~ ('^' || parent || '_p[0-9]{8}$')
    ORDER BY day;
$$;
