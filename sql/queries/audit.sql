-- operator_actions: the audit log (written in each action's transaction), and the last pass
-- of each maintenance job.

-- name: audit_record
-- $1 actor, $2 via (console, cli), $3 action, $4 target, $5 params (jsonb), $6 rows, $7 outcome.
INSERT INTO operator_actions (actor, via, action, target, params, rows, outcome)
VALUES ($1, $2, $3, $4, $5::jsonb, $6, $7)
RETURNING id;

-- name: audit_page
-- Newest first, after the cursor $1 (an id; NULL: from the newest), $2 actor and $3 action
-- (NULL: any), $4 rows at most. Each filter has its own index ending in id.
SELECT id, at, actor, via, action, target, params, rows, outcome
FROM operator_actions
WHERE ($1::bigint IS NULL OR id < $1)
  AND ($2::text IS NULL OR actor = $2)
  AND ($3::text IS NULL OR action = $3)
ORDER BY id DESC
LIMIT $4;

-- name: maintenance_pass_record
-- $1 job, $2 error (NULL: the pass succeeded).
INSERT INTO maintenance_passes AS m (job, last_ok_at, last_failed_at, last_error)
VALUES ($1, CASE WHEN $2::text IS NULL THEN clock_timestamp() END,
        CASE WHEN $2::text IS NOT NULL THEN clock_timestamp() END, $2)
ON CONFLICT (job) DO UPDATE SET
    last_ok_at = coalesce(excluded.last_ok_at, m.last_ok_at),
    last_failed_at = coalesce(excluded.last_failed_at, m.last_failed_at),
    last_error = CASE WHEN $2::text IS NULL THEN m.last_error ELSE $2 END,
    updated_at = clock_timestamp();

-- name: maintenance_passes
SELECT job, last_ok_at, last_failed_at, last_error FROM maintenance_passes ORDER BY job;
