-- Session-level advisory locks that elect one process for a database-wide job.

-- name: leader_try_lock
SELECT pg_try_advisory_lock($1);
