-- The day partition of `parent` for `day` (named <parent>_pYYYYMMDD); false if it existed.
-- Partition bounds are UTC days, for date and timestamptz partition keys alike. Created
-- standalone and then ATTACHed: ATTACH PARTITION takes only SHARE UPDATE EXCLUSIVE on the
-- parent, so inserts and claims go on (CREATE TABLE ... PARTITION OF would lock them out);
-- the parent's indexes are built on the empty table and its identity is shared. A stored
-- generated column must come along as generated, or ATTACH refuses it. On Citus the
-- coordinator runs this unchanged: the ATTACH distributes the new table with its parent.
-- Where the parent has a default partition (processed_webhook_events), the rows of that day
-- are moved out of it first, under its lock (ATTACH scans the default for rows the new
-- partition would hold); the caller's lock_timeout bounds the wait for it.
CREATE OR REPLACE FUNCTION partition_ensure_day(parent text, day date) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    child text := parent || '_p' || to_char(day, 'YYYYMMDD');
    keycol text;
    keytype text;
    lo text;
    hi text;
    def regclass;
BEGIN
    IF to_regclass(child) IS NOT NULL THEN
        RETURN false;
    END IF;
    SELECT a.attname, format_type(a.atttypid, a.atttypmod), nullif(p.partdefid, 0)::regclass
    INTO keycol, keytype, def
    FROM pg_partitioned_table p
    JOIN pg_attribute a ON a.attrelid = p.partrelid AND a.attnum = p.partattrs[0]
    WHERE p.partrelid = parent::regclass;
    IF keytype = 'date' THEN
        lo := quote_literal(day::text);
        hi := quote_literal((day + 1)::text);
    ELSE
        lo := quote_literal(day::text || ' 00:00:00+00');
        hi := quote_literal((day + 1)::text || ' 00:00:00+00');
    END IF;
    EXECUTE format('CREATE TABLE %I (LIKE %I INCLUDING DEFAULTS INCLUDING CONSTRAINTS '
                   'INCLUDING GENERATED INCLUDING STORAGE)', child, parent);
    IF def IS NOT NULL THEN
        EXECUTE format('LOCK TABLE %s IN ACCESS EXCLUSIVE MODE', def);
        EXECUTE format('WITH moved AS (DELETE FROM %s WHERE %I >= %s AND %I < %s RETURNING *) '
                       'INSERT INTO %I SELECT * FROM moved', def, keycol, lo, keycol, hi, child);
    END IF;
    EXECUTE format('ALTER TABLE %I ATTACH PARTITION %I FOR VALUES FROM (%s) TO (%s)', parent, child, lo, hi);
    RETURN true;
END;
$$;
