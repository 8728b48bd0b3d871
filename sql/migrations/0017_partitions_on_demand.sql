-- Nothing that ingests or consumes depends on the maintenance job having run.
--
-- processed_webhook_events: a key's day is a pure function of its event (the UTC day of Meta's
-- own timestamp, gateway/core/events.py: event_day), so a redelivery meets its key whatever the
-- clock did in between. A day that has no partition (a timestamp far from today, or a day the
-- job has not made yet) lands in the DEFAULT partition, trimmed by age like the untimed one;
-- when the day's partition is made, its rows move out of the default into it (below), and when
-- a day partition is dropped, its keys still within the dedup retention by the time they were
-- processed move into the default (gateway/store/retention.py). A partitioned table with a
-- default partition cannot DETACH ... CONCURRENTLY: its day partitions are detached by a short
-- statement under lock_timeout, never while a long transaction holds the table.
--
-- The tables partitioned by the time a row is written (webhook_inbox, inbound_messages,
-- message_statuses, account_errors, account_updates) have no default partition: a row that finds
-- no partition for today makes it on the spot (gateway/store/retention.py: ensure_today) and is
-- written again; their old partitions are still detached CONCURRENTLY.

CREATE TABLE processed_webhook_events_default PARTITION OF processed_webhook_events DEFAULT;
CREATE INDEX processed_webhook_events_default_processed_at ON processed_webhook_events_default (processed_at);
-- Which keys of a day partition about to be dropped were processed recently (a few, if any:
-- events stamped long before they came); the rows are written in processed_at order, so a
-- block range index answers without reading the day.
CREATE INDEX processed_webhook_events_processed_brin ON processed_webhook_events USING brin (processed_at);

-- The functions this relies on are in sql/functions/: partition_ensure_day (moves a day's rows
-- out of the default partition when it makes the day's partition), partition_has_default,
-- partition_blocker.
