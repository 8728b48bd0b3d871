-- The migration bookkeeping.

-- name: schema_migrations_version
SELECT coalesce(max(version), 0) FROM schema_migrations;
