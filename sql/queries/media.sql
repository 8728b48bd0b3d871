-- Media ids and the business number each belongs to (migration 0015).

-- name: media_get
SELECT media_id, phone_number_id, origin, tenant, mime_type, wamid, created_at
FROM media
WHERE media_id = $1;

-- name: media_numbers
-- The number of each known media id among $1.
SELECT media_id, phone_number_id FROM media WHERE media_id = ANY($1::text[]);

-- name: media_record_upload
INSERT INTO media (media_id, phone_number_id, origin, tenant, mime_type)
VALUES ($1, $2, 'upload', $3, $4)
ON CONFLICT (media_id) DO NOTHING;
