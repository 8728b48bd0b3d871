-- The migration bookkeeping.

-- name: schema_migrations_version
SELECT coalesce(max(version), 0) FROM schema_migrations;

-- name: schema_readiness
-- The schema's version, and whether this server takes writes: a standby (in recovery), or a
-- primary set read-only, does not.
SELECT coalesce(max(version), 0) AS version,
       NOT pg_is_in_recovery() AND current_setting('transaction_read_only') = 'off' AS writable
  FROM schema_migrations;
