-- A lane that numbers its own rows. On one PostgreSQL the table stays empty: a row's txid is
-- the id of the transaction that staged it, and a lane's cursor is made of that server's
-- snapshots. On Citus (sql/citus/layout.sql) it holds one row per lane, colocated with the
-- lane's rows, and a trigger on the shards numbers each staged row from it: transaction ids
-- are counted by each worker on its own, so a lane whose shard moves to another worker would
-- otherwise meet numbers unrelated to its cursor's (docs/scaling.md, "Lane numbers").
CREATE TABLE inbox_heads (
    lane smallint PRIMARY KEY CHECK (lane BETWEEN 0 AND 31),
    -- The number of the lane's last staged row: every row numbered up to it has committed
    -- once a reader sees it (the row stays locked by the staging transaction until it commits).
    seq  bigint   NOT NULL CHECK (seq >= 3)
);
