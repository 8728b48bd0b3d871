-- Media the gateway has seen and the business number each belongs to: media that came with an
-- inbound message (origin 'inbound') and media a tenant uploaded through POST /v1/media
-- ('upload'). GET /v1/media/{id} and a send that names a media id are allowed only to a tenant
-- that owns that number; the number also picks the Graph API token. Meta keeps media for 30
-- days, so rows older than that are purged.
CREATE TABLE media (
    media_id        text        PRIMARY KEY,
    phone_number_id text        NOT NULL,
    origin          text        NOT NULL CHECK (origin IN ('inbound', 'upload')),
    tenant          text,
    mime_type       text,
    wamid           text,
    created_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX media_created_at ON media (created_at);

-- Destinations limited to business numbers (NULL: every number), and a tenant's destinations:
-- they get only events of numbers bound to that tenant (GATEWAY_TENANT_NUMBERS).
ALTER TABLE destinations
    ADD COLUMN numbers text[],
    ADD COLUMN tenant text;
