-- Claims without row writes. A forwarder used to claim a delivery by updating its row to
-- 'delivering' (a new version of a wide row and an entry in every index), then update it
-- again with the outcome: two non-HOT updates per delivery, which made the database, not
-- HTTP, the forwarder's bottleneck. Now a claim is recorded once per round, per forwarder
-- and destination: the ids it holds, in one narrow row whose lease every round renews. A
-- delivery row is written once, with its outcome. A forwarder that dies stops renewing;
-- once its lease has run out, any forwarder's housekeeping deletes the row and its
-- deliveries are due again (at least once; the webhook-id lets a receiver deduplicate).
CREATE TABLE delivery_leases (
    -- host:pid:random, chosen by the forwarder at start (a restarted one holds nothing)
    forwarder      text        NOT NULL,
    destination_id bigint      NOT NULL REFERENCES destinations (id) ON DELETE CASCADE,
    ids            bigint[]    NOT NULL DEFAULT '{}',
    lease_until    timestamptz NOT NULL,
    PRIMARY KEY (forwarder, destination_id)
);

-- Rows claimed the old way ('delivering') by a forwarder of an earlier version are still
-- released by the housekeeping when their lease_until passes.
