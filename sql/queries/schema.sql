-- The migration bookkeeping.

-- name: schema_migrations_version
SELECT coalesce(max(version), 0) FROM schema_migrations;

-- name: schema_functions_absent
-- Which of these function sources ($1, names) `gateway migrate` has never applied here: code
-- that adds a function runs only once it is there (a new replica at the same schema version
-- would otherwise start before the migration that brings its functions).
SELECT coalesce(array_agg(n ORDER BY n), '{}') FROM unnest($1::text[]) AS n
WHERE NOT EXISTS (SELECT 1 FROM schema_functions f WHERE f.name = n);

-- name: schema_readiness
-- The schema's version, and whether this server takes writes: a standby (in recovery), or a
-- primary set read-only, does not.
SELECT coalesce(max(version), 0) AS version,
       NOT pg_is_in_recovery() AND current_setting('transaction_read_only') = 'off' AS writable
  FROM schema_migrations;

-- name: citus_installed
-- Whether this database is a Citus node (the extension installed in it).
SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus');

-- name: citus_distributed
-- Whether sql/citus/layout.sql has distributed the gateway's tables here (only with the citus
-- extension installed: pg_dist_partition is its catalog).
SELECT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = to_regclass('webhook_inbox'));

-- name: citus_lanes_restart
-- Each lane's cursor at its head (inbox_heads, on the same shard: every row numbered so far
-- is read), nobody owning it: after sql/citus/layout.sql first distributed the inbox log.
-- Whether every shard took it.
SELECT bool_and(success) FROM run_command_on_colocated_placements('inbox_lanes', 'inbox_heads', $cmd$
    UPDATE %s l SET done_snap = ((h.seq + 1)::text || ':' || (h.seq + 1)::text || ':')::pg_snapshot,
                    win_snap = NULL, pos_txid = NULL, pos_id = NULL, version = l.version + 1,
                    owner = NULL, lease_until = NULL
    FROM %s h WHERE h.lane = l.lane
$cmd$);
