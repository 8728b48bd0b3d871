-- Whether `parent` has a default partition (its day partitions are then detached by the short,
-- non-concurrent statement).
CREATE OR REPLACE FUNCTION partition_has_default(parent text) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT partdefid <> 0 FROM pg_partitioned_table WHERE partrelid = parent::regclass), false);
$$;
