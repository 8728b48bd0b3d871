-- What each statement cost PostgreSQL over a phase (pg_stat_statements, loaded by
-- loadtest.harness.database.statements): read by loadtest.harness.pgstat.

-- name: pgstat_reset
SELECT pg_stat_statements_reset();

-- name: pgstat_top
-- The database's statements by total time (planning included), with their share of all of it.
SELECT query, calls, total_ms, total_ms / nullif(calls, 0) AS mean_ms, rows,
       total_ms / nullif(sum(total_ms) OVER (), 0) AS share
FROM (
    SELECT s.query, s.calls, s.total_exec_time + s.total_plan_time AS total_ms, s.rows
    FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
    WHERE d.datname = current_database() AND s.query NOT LIKE '%pg_stat_statements%'
) AS per_statement
ORDER BY total_ms DESC
LIMIT $1;
