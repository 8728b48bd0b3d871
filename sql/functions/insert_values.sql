-- INSERT INTO p_into (a table and its column list, as SQL) the rows p_rows (values_list's
-- argument) as one VALUES list, followed by p_tail (an ON CONFLICT clause, say); how many rows it
-- wrote (0 for no rows). inbox_apply_batch_steps writes with it on Citus (values_list says why).
CREATE OR REPLACE FUNCTION insert_values(p_into text, p_rows json, p_tail text DEFAULT '') RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_values text := values_list(p_rows);
    n bigint := 0;
BEGIN
    IF v_values IS NOT NULL THEN
        EXECUTE 'INSERT INTO ' || p_into || ' VALUES ' || v_values || ' ' || p_tail;
        GET DIAGNOSTICS n = ROW_COUNT;
    END IF;
    RETURN n;
END;
$$;
