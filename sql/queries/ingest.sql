-- name: insert_inbox_batch
-- One statement per group-commit batch, rows in arrival order.
INSERT INTO webhook_inbox (source, body, delivery_id)
SELECT source, body, delivery_id
FROM unnest($1::text[], $2::bytea[], $3::text[]) WITH ORDINALITY AS t(source, body, delivery_id, n)
ORDER BY n;

-- name: inbox_depth
SELECT count(*) FROM webhook_inbox WHERE state = 'pending';

-- name: ready_check
SELECT coalesce(max(version), 0) FROM schema_migrations;

-- name: insert_inbox_one
-- One row, its own transaction: the baseline's path and a helper for tools and tests.
INSERT INTO webhook_inbox (source, body, delivery_id) VALUES ($1, $2, $3) RETURNING id;
