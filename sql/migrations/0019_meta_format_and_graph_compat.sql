-- Existing bots behind the gateway: Meta-format destinations and the Graph-compatible send
-- endpoint.

-- A destination's format: 'standard' (Standard Webhooks envelope, whsec_ secret) or 'meta'
-- (each event as its own Meta webhook body, signed X-Hub-Signature-256 with the secret, which
-- is then any non-empty string, as a Meta app secret is). A Meta-format delivery stores its
-- Meta body in deliveries.envelope (sql/functions/meta_webhook.sql renders it).
ALTER TABLE destinations
    ADD COLUMN format text NOT NULL DEFAULT 'standard' CHECK (format IN ('standard', 'meta'));
ALTER TABLE destinations
    DROP CONSTRAINT destinations_secret_check,
    DROP CONSTRAINT destinations_previous_secret_check,
    ADD CONSTRAINT destinations_secret_check
        CHECK (secret <> '' AND (format = 'meta' OR secret LIKE 'whsec\_%')),
    ADD CONSTRAINT destinations_previous_secret_check
        CHECK (previous_secret <> '' AND (format = 'meta' OR previous_secret LIKE 'whsec\_%'));

-- A Graph-compatible request waits for its row's outcome: every change of state of such a row
-- is announced on NOTIFY outbox_outcome (sql/functions/outbox_outcome_notify.sql creates the
-- trigger with its function). provider_error: the provider's refusal as it answered it,
-- {"status": <HTTP status>, "error": <Meta's error object>}, so the Graph-compatible endpoint
-- answers a refused send with Meta's own error.
ALTER TABLE outbox
    ADD COLUMN notify_outcome boolean NOT NULL DEFAULT false,
    ADD COLUMN provider_error jsonb;
