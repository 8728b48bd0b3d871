-- What a queued delivery to a destination with --ordered keeps of its customer
-- (delivery_queue.conv): a 64-bit hash of the conversation, NULL when there is none (nothing to
-- order). Two customers whose hashes collide are merely ordered together.
CREATE OR REPLACE FUNCTION delivery_conversation(conversation text) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN conversation <> '' THEN hashtextextended(conversation, 0) END;
$$;
