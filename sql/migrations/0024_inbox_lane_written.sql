-- webhook_inbox.lane becomes a plain column that the staging INSERT writes, and part of the
-- primary key, so that the table can be distributed by its lane on Citus (docs/scaling.md):
-- Citus refuses a generated distribution column, and every primary or unique key of a
-- distributed table must contain the distribution column.
--
-- The group commit writes one lane per batch (gateway/inbound/groupcommit.py), so a batch is
-- one shard's insert on Citus. A statement that names no lane (tests, tools, an older edge)
-- gets `id % 32` as before: the default reads the identity value this row just took (a row's
-- column defaults are computed in column order, and id comes first). Values of existing rows
-- do not change: DROP EXPRESSION keeps what was stored.
--
-- On a populated database this rebuilds the primary key index of every day partition of
-- webhook_inbox (no table rewrite), under its ACCESS EXCLUSIVE lock: staging waits for it.
ALTER TABLE webhook_inbox ALTER COLUMN lane DROP EXPRESSION;
ALTER TABLE webhook_inbox ALTER COLUMN lane SET DEFAULT (currval('webhook_inbox_id_seq'::regclass) % 32)::smallint;
ALTER TABLE webhook_inbox ALTER COLUMN lane SET NOT NULL;
ALTER TABLE webhook_inbox ADD CONSTRAINT webhook_inbox_lane_check CHECK (lane BETWEEN 0 AND 31);
ALTER TABLE webhook_inbox DROP CONSTRAINT webhook_inbox_pkey;
ALTER TABLE webhook_inbox ADD CONSTRAINT webhook_inbox_pkey PRIMARY KEY (id, received_at, lane);
