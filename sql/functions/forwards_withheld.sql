-- The consumers' batch statement (inbox_apply_batch, and inbox_apply_batch_steps on Citus)
-- calls this when a batch came without its events' forwards, the consumer believing no
-- destination enabled, while one is: the batch fails with SQLSTATE GWF01 (a class of the
-- gateway's own), and the consumer rolls it back to its savepoint and sends it again with them
-- (gateway/inbound/applier.py). Never returns.
CREATE OR REPLACE FUNCTION forwards_withheld() RETURNS text
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RAISE EXCEPTION 'a batch came without forwards while a destination is enabled'
        USING ERRCODE = 'GWF01';
END
$$;
