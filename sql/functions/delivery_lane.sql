-- The lane (0..31) of an event's delivery rows (delivery_events, delivery_queue, delivery_log):
-- a hash of its customer (the conversation: phone number, else BSUID), else of its subject (an
-- account-level event names no customer). The column those tables would be distributed on: a
-- customer's deliveries, and so the per-customer ordering of a destination with --ordered,
-- stay in one lane, on one shard (docs/scaling.md). Stored on every row, so a change of this
-- rule applies to new rows only (migration 0021 computes it inline, the same way).
CREATE OR REPLACE FUNCTION delivery_lane(conversation text, subject text) RETURNS smallint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT (hashtextextended(coalesce(nullif(conversation, ''), subject), 0) & 31)::smallint;
$$;
