-- Trigger of outbox (statement level, with its transition tables): every row that leaves
-- 'sending' records its attempt's outcome and the provider's answer in outbox_attempts.
CREATE OR REPLACE FUNCTION outbox_attempts_record() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO outbox_attempts (outbox_id, sent_at, outcome, code, error, wamid)
    SELECT n.id, o.sending_at, n.state, n.last_error_code, n.last_error, n.wamid
    FROM new_rows n JOIN old_rows o ON o.id = n.id
    WHERE o.state = 'sending' AND n.state <> 'sending';
    RETURN NULL;
END;
$$;
