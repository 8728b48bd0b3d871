-- webhook_inbox becomes a log: the ingest edge appends, the consumers read each lane by a
-- cursor and never write an inbox row again (docs/consumers.md, "Lanes and cursors").
--
--   webhook_inbox.txid   the inserting transaction's id (pg_current_xact_id()): a cursor reads
--                        the rows whose transactions committed between two snapshots, so a
--                        row that commits late with a smaller id is read in a later window
--   inbox_lanes          one row per lane (id % 32): its owner and lease, and its cursor
--                        (done_snap: every row of a transaction visible in it is read;
--                        win_snap/pos_*: the window being read and how far it got)
--   consumer_members     the consumer processes alive, for the lanes' assignment
--   inbox_parked         whole webhooks moved aside: not JSON or of no known shape (dead at
--                        once), or one that failed where nothing could be recorded (retried
--                        on its own, dead after GATEWAY_MAX_ATTEMPTS)
--
-- On a populated database: rows still pending get this migration's transaction id and are
-- read by the first cursors; dead rows move to inbox_parked with their bytes; processed rows
-- keep a NULL txid and are never read again. The new index is built over every partition in
-- this transaction (ingest waits for it): run `gateway migrate` in a quiet window, with the
-- consumers of the previous version stopped (their claims name the columns dropped here).

ALTER TABLE webhook_inbox ADD COLUMN txid xid8;
ALTER TABLE webhook_inbox ALTER COLUMN txid SET DEFAULT pg_current_xact_id();

CREATE TABLE inbox_parked (
    inbox_id        bigint      PRIMARY KEY,
    received_at     timestamptz NOT NULL,
    source          text        NOT NULL,
    delivery_id     text,
    body            bytea       NOT NULL,
    state           text        NOT NULL CHECK (state IN ('retry', 'dead', 'done')),
    attempts        integer     NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    last_error      text,
    created_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at      timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX inbox_parked_due ON inbox_parked (next_attempt_at, inbox_id) WHERE state = 'retry';
CREATE INDEX inbox_parked_open ON inbox_parked (state, received_at, inbox_id) WHERE state <> 'done';
CREATE INDEX inbox_parked_done ON inbox_parked (updated_at) WHERE state = 'done';

INSERT INTO inbox_parked (inbox_id, received_at, source, delivery_id, body, state, attempts,
                          next_attempt_at, last_error)
SELECT id, received_at, source, delivery_id, body, 'dead', attempts, next_attempt_at, last_error
FROM webhook_inbox WHERE state = 'dead';

UPDATE webhook_inbox SET txid = pg_current_xact_id() WHERE state = 'pending';

CREATE TABLE inbox_lanes (
    lane        smallint    PRIMARY KEY CHECK (lane BETWEEN 0 AND 31),
    -- Lanes of one shard are read together (0 everywhere on one PostgreSQL).
    shard       integer     NOT NULL DEFAULT 0,
    owner       text,
    lease_until timestamptz,
    done_snap   pg_snapshot NOT NULL,
    win_snap    pg_snapshot,
    pos_txid    xid8,
    pos_id      bigint,
    version     bigint      NOT NULL DEFAULT 0,
    advanced_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    CHECK ((win_snap IS NULL) = (pos_txid IS NULL) AND (pos_txid IS NULL) = (pos_id IS NULL))
);

-- The first cursors have read nothing this transaction wrote, nor any transaction running
-- now: this snapshot with this transaction's own id among those in progress.
INSERT INTO inbox_lanes (lane, done_snap)
SELECT l, format('%s:%s:%s',
                 least(pg_snapshot_xmin(s), me),
                 greatest(pg_snapshot_xmax(s), (me::text::numeric + 1)::text::xid8),
                 (SELECT string_agg(x::text, ',' ORDER BY x)
                  FROM (SELECT x FROM pg_snapshot_xip(s) AS x UNION SELECT me) xs))::pg_snapshot
FROM generate_series(0, 31) AS l,
     (SELECT pg_current_snapshot() AS s, pg_current_xact_id() AS me) cur;

CREATE TABLE consumer_members (
    member        text        PRIMARY KEY,
    -- The backend of the member's own connection: a member whose backend is gone has died.
    pid           integer     NOT NULL,
    backend_start timestamptz NOT NULL,
    seen_at       timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- Columns and indexes of the rows' states go (their indexes with them).
ALTER TABLE webhook_inbox
    DROP COLUMN state,
    DROP COLUMN attempts,
    DROP COLUMN next_attempt_at,
    DROP COLUMN last_error,
    DROP COLUMN processed_at;

-- The cursors' read: rows of transactions past a snapshot, in (txid, id) order.
CREATE INDEX webhook_inbox_log ON webhook_inbox (txid, id) WHERE txid IS NOT NULL;
