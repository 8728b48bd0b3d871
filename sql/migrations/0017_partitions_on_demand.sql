-- Nothing that ingests or consumes depends on the maintenance job having run.
--
-- processed_webhook_events: a key's day is a pure function of its event (the UTC day of Meta's
-- own timestamp, gateway/core/events.py: event_day), so a redelivery meets its key whatever the
-- clock did in between. A day that has no partition (a timestamp far from today, or a day the
-- job has not made yet) lands in the DEFAULT partition, trimmed by age like the untimed one;
-- when the day's partition is made, its rows move out of the default into it (below), and when
-- a day partition is dropped, its keys still within the dedup retention by the time they were
-- processed move into the default (gateway/store/retention.py). A partitioned table with a
-- default partition cannot DETACH ... CONCURRENTLY: its day partitions are detached by a short
-- statement under lock_timeout, never while a long transaction holds the table.
--
-- The tables partitioned by the time a row is written (webhook_inbox, inbound_messages,
-- message_statuses, account_errors, account_updates) have no default partition: a row that finds
-- no partition for today makes it on the spot (gateway/store/inbox.py: ensure_partition) and is
-- written again; their old partitions are still detached CONCURRENTLY.

CREATE TABLE processed_webhook_events_default PARTITION OF processed_webhook_events DEFAULT;
CREATE INDEX processed_webhook_events_default_processed_at ON processed_webhook_events_default (processed_at);
-- Which keys of a day partition about to be dropped were processed recently (a few, if any:
-- events stamped long before they came); the rows are written in processed_at order, so a
-- block range index answers without reading the day.
CREATE INDEX processed_webhook_events_processed_brin ON processed_webhook_events USING brin (processed_at);

-- The day partition of `parent` for `day` (named <parent>_pYYYYMMDD); false if it existed.
-- As in 0009, and: created standalone and then ATTACHed: ATTACH PARTITION takes only SHARE UPDATE EXCLUSIVE on
-- the parent, so inserts and claims go on. Where the parent has a default partition, the rows
-- of that day are moved out of it first, under its lock (ATTACH scans the default for rows the
-- new partition would hold); the caller's lock_timeout bounds the wait for it.
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

-- Whether `parent` has a default partition (its day partitions are then detached by the short,
-- non-concurrent statement).
CREATE FUNCTION partition_has_default(parent text) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT partdefid <> 0 FROM pg_partitioned_table WHERE partrelid = parent::regclass), false);
$$;

-- A transaction that has held a lock on `rel` (or one of its partitions) for more than `held`:
-- its pid and since when (NULL: none). A DDL that needs the table queued behind it would hold
-- up every writer queued behind the DDL, so the job skips that step and says who is in the way.
CREATE FUNCTION partition_blocker(rel text, held interval, OUT pid int, OUT since timestamptz)
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
