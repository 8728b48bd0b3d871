-- Who a customer is since Meta's business-scoped user ids (BSUIDs): a message or status names
-- the customer by phone number (wa_id) and/or BSUID (user_id), parent BSUID and username. The
-- feed tables keep each of them, where the event came in (the change's metadata and the
-- WhatsApp Business Account id), and the customer's contacts[] object as Meta sent it.
ALTER TABLE inbound_messages
    ADD COLUMN user_id text,
    ADD COLUMN parent_user_id text,
    ADD COLUMN username text,
    ADD COLUMN waba_id text,
    ADD COLUMN display_phone_number text,
    ADD COLUMN contact jsonb;

-- biz_opaque_callback_data is the send API caller's own value for the message (the provider
-- echoes the gateway's key, callback_data).
ALTER TABLE message_statuses
    ADD COLUMN recipient_user_id text,
    ADD COLUMN recipient_parent_user_id text,
    ADD COLUMN recipient_username text,
    ADD COLUMN phone_number_id text,
    ADD COLUMN waba_id text,
    ADD COLUMN display_phone_number text,
    ADD COLUMN contact jsonb,
    ADD COLUMN biz_opaque_callback_data text;

-- The caller's biz_opaque_callback_data, returned with the message's statuses.
ALTER TABLE outbox ADD COLUMN biz_opaque_callback_data text;

-- The phone number and parent BSUID seen with each BSUID, per business number (a BSUID is
-- scoped to the business portfolio that owns the number): so the phone number and the BSUID
-- of one customer are one person for pacing and the reply guard. A row is written by the
-- consumers whenever an event shows the pair; the latest phone number wins.
CREATE TABLE customer_ids (
    phone_number_id text        NOT NULL,
    user_id         text        NOT NULL,
    wa_id           text,
    parent_user_id  text,
    username        text,
    first_seen_at   timestamptz NOT NULL DEFAULT now(),
    seen_at         timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (phone_number_id, user_id)
);
CREATE INDEX customer_ids_wa_id ON customer_ids (phone_number_id, wa_id, seen_at)
    WHERE wa_id IS NOT NULL;
CREATE INDEX customer_ids_parent ON customer_ids (phone_number_id, parent_user_id, seen_at)
    WHERE parent_user_id IS NOT NULL;
