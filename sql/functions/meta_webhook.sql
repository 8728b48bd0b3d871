-- The body a Meta-format destination gets for one event: the event as its own Meta webhook,
-- rendered from the event's forwarding envelope (gateway.core.envelope.envelope, documented
-- in docs/forwarding.md), which keeps what Meta sent: the message or status object as it
-- came, the contact as it came, the change's metadata and the WABA id.
--   {"object": "whatsapp_business_account",
--    "entry": [{"id": <WABA id>, "changes": [{"field": "messages",
--               "value": {"messaging_product": "whatsapp", "metadata": {...},
--                         "contacts": [<the event's contact>], "messages"|"statuses": [<it>]}}]}]}
-- Account errors and other changes (any field) keep their value as it came:
--   "changes": [{"field": <field>, "value": <value>}].
-- A group status listing several participants is one event per participant: its participant
-- list names that one. tracker: what a status's biz_opaque_callback_data becomes (the caller's
-- own value, given to the send API, instead of the gateway's key that Meta echoes): SQL NULL
-- leaves it as Meta sent it (not a send of ours), JSON null removes it, a string replaces it.
-- NULL for an event that did not come from Meta (a Tenashi event has no Meta shape).
CREATE OR REPLACE FUNCTION meta_webhook(envelope jsonb, tracker jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $fn$
SELECT CASE WHEN envelope->>'source' = 'meta' THEN jsonb_build_object(
    'object', 'whatsapp_business_account',
    'entry', jsonb_build_array(jsonb_build_object(
        'id', envelope->'data'->'waba_id',
        'changes', jsonb_build_array(
            CASE envelope->>'type'
            WHEN 'message.received' THEN jsonb_build_object('field', 'messages', 'value',
                jsonb_build_object(
                    'messaging_product', 'whatsapp',
                    'metadata', jsonb_strip_nulls(jsonb_build_object(
                        'display_phone_number', envelope->'data'->'display_phone_number',
                        'phone_number_id', envelope->'data'->'phone_number_id')))
                || CASE WHEN jsonb_typeof(envelope->'data'->'contact') = 'object'
                        THEN jsonb_build_object('contacts', jsonb_build_array(envelope->'data'->'contact'))
                        ELSE '{}'::jsonb END
                || jsonb_build_object('messages', jsonb_build_array(envelope->'raw')))
            WHEN 'message.status' THEN jsonb_build_object('field', 'messages', 'value',
                jsonb_build_object(
                    'messaging_product', 'whatsapp',
                    'metadata', jsonb_strip_nulls(jsonb_build_object(
                        'display_phone_number', envelope->'data'->'display_phone_number',
                        'phone_number_id', envelope->'data'->'phone_number_id')))
                || CASE WHEN jsonb_typeof(envelope->'data'->'contact') = 'object'
                        THEN jsonb_build_object('contacts', jsonb_build_array(envelope->'data'->'contact'))
                        ELSE '{}'::jsonb END
                || jsonb_build_object('statuses', jsonb_build_array(
                    -- (the status object is spelled out in each branch: a sub-SELECT computing it
                    -- once would keep this function from being inlined into the statements that
                    -- call it, and a call per event costs more than the expression)
                    CASE WHEN tracker IS NULL THEN
                             CASE WHEN jsonb_typeof(envelope->'raw'->'recipient_participant_id') = 'array'
                              THEN jsonb_set(envelope->'raw', '{recipient_participant_id}',
                                             jsonb_build_array(envelope->'data'->'participant'))
                              WHEN jsonb_typeof(envelope->'raw'->'recipient_participant_user_id') = 'array'
                              THEN jsonb_set(envelope->'raw', '{recipient_participant_user_id}',
                                             jsonb_build_array(envelope->'data'->'participant'))
                              ELSE envelope->'raw' END
                         WHEN jsonb_typeof(tracker) = 'null' THEN
                             (CASE WHEN jsonb_typeof(envelope->'raw'->'recipient_participant_id') = 'array'
                              THEN jsonb_set(envelope->'raw', '{recipient_participant_id}',
                                             jsonb_build_array(envelope->'data'->'participant'))
                              WHEN jsonb_typeof(envelope->'raw'->'recipient_participant_user_id') = 'array'
                              THEN jsonb_set(envelope->'raw', '{recipient_participant_user_id}',
                                             jsonb_build_array(envelope->'data'->'participant'))
                              ELSE envelope->'raw' END) - 'biz_opaque_callback_data'
                         ELSE jsonb_set(CASE WHEN jsonb_typeof(envelope->'raw'->'recipient_participant_id') = 'array'
                              THEN jsonb_set(envelope->'raw', '{recipient_participant_id}',
                                             jsonb_build_array(envelope->'data'->'participant'))
                              WHEN jsonb_typeof(envelope->'raw'->'recipient_participant_user_id') = 'array'
                              THEN jsonb_set(envelope->'raw', '{recipient_participant_user_id}',
                                             jsonb_build_array(envelope->'data'->'participant'))
                              ELSE envelope->'raw' END,
                                        '{biz_opaque_callback_data}', tracker) END)))
            ELSE jsonb_build_object('field', envelope->'data'->'field', 'value', envelope->'raw')
            END))))
END
$fn$;
