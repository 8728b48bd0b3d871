-- Per-customer order of sends: a claim looks up, for each due row, the nearest earlier row to
-- the same person from the same number that may still be sent, and holds the row
-- behind it (sql/queries/outbox.sql, outbox_claim_candidates). Open rows only: the index stays
-- the size of the backlog, not of the history.
CREATE INDEX outbox_open_by_recipient ON outbox (phone_number_id, recipient, id)
    WHERE state IN ('pending', 'sending', 'unknown');
