-- Secret rotation for forwarding destinations (gateway destinations rotate-secret): the
-- secret being replaced stays valid until previous_secret_until. Meanwhile every request
-- carries two signatures, "v1,<new> v1,<old>" (the Standard Webhooks specification allows
-- several, space-separated), so a receiver verifies with either secret while it switches.
ALTER TABLE destinations
    ADD COLUMN previous_secret text CHECK (previous_secret LIKE 'whsec\_%'),
    ADD COLUMN previous_secret_until timestamptz,
    ADD CONSTRAINT destinations_previous_secret_until_check
        CHECK ((previous_secret IS NULL) = (previous_secret_until IS NULL));
